# zsh testdata/zsh-complete.zsh 'LINE': print, one a line, the matches
# zsh's own completion system offers at the end of LINE, with the
# completions in $ZSH_COMPLETIONS first on fpath (completion.txtar). It
# types LINE and a Tab into an interactive zsh on a pseudo-terminal
# (zsh/zpty), and records what the completion functions hand compadd.
zmodload zsh/zpty || exit 1
zpty z zsh -f -i
init=$(mktemp)
cat >$init <<'INIT'
PROMPT=
fpath=($ZSH_COMPLETIONS $fpath)
autoload -U compinit && compinit -u -D
bindkey '^M' undefined
bindkey '^J' undefined
bindkey '^I' complete-word
null-line() { print -rn -- $'\0\n' }
compprefuncs=( null-line )
comppostfuncs=( null-line exit )
zstyle ':completion:*' list-grouped false
zstyle ':completion:*' insert-tab false
compadd() {
  if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then
    builtin compadd "$@"; return $?
  fi
  local -a __hits
  builtin compadd -A __hits "$@"
  (( $#__hits )) && print -rl -- $__hits
  builtin compadd "$@"
}
print ok
INIT
zpty -w z "source $init"
repeat 8; do zpty -r z line; [[ $line == ok* ]] && break; done
zpty -w z "$1"$'\t'
integer tog=0
while zpty -r z line; do
  if [[ $line == *$'\0'* ]]; then
    (( tog++ )) && break || continue
  fi
  line=${${line//$'\r'/}//$'\n'/}
  (( tog )) && [[ -n $line ]] && print -r -- $line
done
zpty -d z
rm -f $init
