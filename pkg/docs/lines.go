package docs

import (
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// codeBlock is one fenced code block of a markdown text.
type codeBlock struct {
	Info  string   // what follows the opening fence: sh, conf, json, ...
	Line  int      // the line of its first content line, from 1
	Lines []string // its lines, the fence's indentation removed
}

// codeBlocks finds the fenced (```) code blocks of a markdown text, also
// those indented under a list item.
func codeBlocks(src string) []codeBlock {
	var blocks []codeBlock
	var cur *codeBlock
	indent := ""
	for n, l := range strings.Split(src, "\n") {
		t := strings.TrimLeft(l, " ")
		if cur == nil {
			if strings.HasPrefix(t, "```") {
				indent = l[:len(l)-len(t)]
				cur = &codeBlock{Info: strings.TrimSpace(strings.TrimPrefix(t, "```")), Line: n + 2}
			}
			continue
		}
		if strings.HasPrefix(t, "```") {
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		cur.Lines = append(cur.Lines, strings.TrimPrefix(l, indent))
	}
	return blocks
}

// CheckMarkdown holds a markdown text's code to the command definitions:
// every call of a fleet command in a block marked sh (continued lines
// joined) must name commands and flags that exist, with a value where a
// flag takes one and every required flag; every "key = value" line of a
// block marked conf must name a config key. It returns how many command
// calls and config lines it checked, and what is wrong, by line.
func CheckMarkdown(name, src string, apps []*ucli.App) (int, []string) {
	byName := map[string]*ucli.App{}
	for _, a := range apps {
		byName[a.Name] = a
	}
	checked := 0
	var errs []string
	for _, b := range codeBlocks(src) {
		switch b.Info {
		case "sh":
			for i := 0; i < len(b.Lines); i++ {
				at, line := b.Line+i, b.Lines[i]
				for strings.HasSuffix(line, `\`) && i+1 < len(b.Lines) {
					i++
					line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(b.Lines[i])
				}
				n, lineErrs := checkCommandLine(byName, line)
				checked += n
				for _, e := range lineErrs {
					errs = append(errs, fmt.Sprintf("%s:%d: %q: %s", name, at, line, e))
				}
			}
		case "conf":
			for i, line := range b.Lines {
				line = strings.TrimSpace(line)
				if line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				if !configLine.MatchString(line) {
					errs = append(errs, fmt.Sprintf("%s:%d: %q: not a key = value line", name, b.Line+i, line))
					continue
				}
				checked++
				for _, e := range checkConfigLine(fmt.Sprintf("%s:%d:", name, b.Line+i), line) {
					errs = append(errs, e)
				}
			}
		}
	}
	return checked, errs
}
