package fault

// KindInfo is one kind's line: the hint a failure of that kind gets when
// the code that raised it gave none (HintFor; {cmd} is the command that
// reports it), or, for a kind with no next step to name, why not.
// Exactly one of Hint and None is set (TestEveryKindHasANextStep).
type KindInfo struct {
	Kind Kind
	Hint string // the next step, as a command where there is one
	None string // why there is no next step
}

// KindTable is the closed set of kinds, one line each: a new kind needs
// its constant (fault.go) and one line here.
var KindTable = []KindInfo{
	{Kind: KindUsage, Hint: "see: {cmd} --help"},
	{Kind: KindBadConfig, Hint: "fix the setting named above: fleet-config(5) lists every key, its variable and its default"},
	{Kind: KindAmbiguous, Hint: "name it as NAME@HOST, or by its gid (fleet-roster lists both)"},
	{Kind: KindNameTaken, Hint: "pick another name, or remove the old entity first: fleet-roster leave NAME"},
	{Kind: KindUnknownProfile, Hint: "name one of the target host's launch profiles (its config file, fleet-config(5))"},
	{Kind: KindEmptyBody, Hint: "give the text as arguments, or on stdin with -"},
	{Kind: KindBodyTooLarge, Hint: "send a shorter text, or write it to a file and send its path; the limit is the gateway's max-body (fleet-config(5))"},
	{Kind: KindBadUTF8, Hint: "send UTF-8 text: convert it (iconv -t UTF-8), or encode binary data (base64)"},
	{Kind: KindBadFrame, Hint: "check that this command and fleet-gw are one version: {cmd} --version, fleet-gw status"},
	{Kind: KindBadEnvelope, None: "a message from the broker or another host that is not a fleet envelope: it is refused and dead-lettered, and nothing the caller runs mends it"},
	{Kind: KindNewerSchema, Hint: "upgrade fleet on this host: the message comes from a newer version"},
	{Kind: KindProtocol, Hint: "check that this command and fleet-gw are one version: {cmd} --version, fleet-gw status"},
	{Kind: KindUnknownRecipient, Hint: "list entities with: fleet-roster"},
	{Kind: KindUnknownMessage, Hint: "check the msg id: fleet-send prints it first; fleet-roster dead lists the dead letters"},
	{Kind: KindUnknownEntity, Hint: "list entities with: fleet-roster"},
	{Kind: KindUnknownTrace, Hint: "check the trace id: fleet-send prints it after the msg id"},
	{Kind: KindUnknownHost, Hint: "fleet-gw trust list names the hosts this one trusts; fleet-gw status shows which are up"},
	{Kind: KindRosterSettling, Hint: "try again in a few seconds: the roster still fills after connecting to the broker"},
	{Kind: KindNoGateway, Hint: "start one with: fleet-gw run (or set FLEET_SOCKET to a running gateway's socket)"},
	{Kind: KindBrokerDown, Hint: "fleet-gw status shows the broker's state; try again once it is connected"},
	{Kind: KindBrokerBlocked, Hint: "the broker is short of memory or disk (rabbitmq-diagnostics alarms); try again once it has room"},
	{Kind: KindShuttingDown, Hint: "try again once the gateway is back: fleet-gw status"},
	{Kind: KindSlowWatcher, Hint: "read the stream as it comes (a pipe into a slow program falls behind): {cmd} again, into a faster reader or a file"},
	{Kind: KindInternal, Hint: "a bug in fleet: report it with the gateway's log around this time (journalctl --user -u fleet-gw)"},
	{Kind: KindLaunchFailed, Hint: "the command's output is in the message; check the profile on the target host (fleet-config(5)), then spawn again"},
	{Kind: KindSpawnUncertain, Hint: "look before spawning again: fleet-roster lists the entity if it came up"},
	{Kind: KindStateDir, Hint: "check the folder's owner, mode and free space (fleet-security(7))"},
	{Kind: KindOutput, Hint: "check where the output goes: a closed pipe, a full disk or a folder this user may not write"},
	{Kind: KindGatewayLocked, Hint: "stop the other gateway first, or give this one its own --state-dir and --socket"},
	{Kind: KindHostTaken, Hint: "stop the other gateway of this host id, or give this one its own --host (fleet-security(7))"},
	{Kind: KindTimeout, Hint: "try again, with a longer --timeout"},
	{Kind: KindBrokerTimeout, Hint: "the outcome is unknown: look with fleet-trace TRACE_ID before sending again"},
	{Kind: KindBrokerRefused, Hint: "fleet-gw status shows the broker's state; the gateway's log says what it refused"},
	{Kind: KindInboxFull, Hint: "try again once the recipient has read its mail (its pending count in fleet-roster falls)"},
	{Kind: KindInboxBusy, Hint: "another fleet-recv drains this inbox: let it end or stop it, then try again"},
	{Kind: KindTooLate, Hint: "the asker no longer waits: send it as a plain message instead (fleet-send NAME TEXT)"},
	{Kind: KindTooManyConnections, Hint: "end idle fleet-recv --follow or fleet-mcp processes, or raise max-connections (fleet-config(5))"},
	{Kind: KindBadCredential, Hint: "use the credential fleet-roster join printed on this host, or --as NAME (fleet-roster whoami shows who a credential is)"},
	{Kind: KindNoCredential, Hint: "set FLEET_TOKEN to the credential fleet-roster join printed, or pass --as NAME"},
	{Kind: KindNotAgent, Hint: "fleet-agents(7) says how each mode takes its mail"},
	{Kind: KindHooksBlocked, Hint: "fleet-roster hooks doctor says what to mend"},
	{Kind: KindSandboxed, Hint: "let the agent CLI's sandbox reach the gateway's socket (fleet-agents(7))"},
	{Kind: KindPeer, Hint: "use a gateway of your own user: fleet-gw run, and FLEET_SOCKET set to its socket"},
	{Kind: KindBrokerLogin, Hint: "check the broker URI's user and password (fleet-broker(7)); fleet-gw broker-setup makes a login"},
	{Kind: KindAskArrived, Hint: "answer it: fleet-send --answer ASK_ID TEXT, then wait again: fleet-send --wait-reply MSG_ID"},
	{Kind: KindNotAuthentic, Hint: "it may not be delivered again; remove it with: fleet-dlq purge MSG_ID"},
	{Kind: KindNotReplayable, None: "the dead letter cannot be delivered again (no message kept, or a kind that is never replayed); the message says which, and no command changes that"},
	{Kind: KindNotPrivate, Hint: "make it this user's alone (chown, chmod go-rwx, no link), as fleet-security(7) says"},
	{Kind: KindHostGone, Hint: "ask again once the host is back (fleet-gw status lists the peers), or add --wait-for-host"},
	{Kind: KindNotAccepted, Hint: "the recipient does not take messages from you: its host's user may allow it (fleet-roster accept NAME add PATTERN there, fleet-security(7) ACCEPTING MESSAGES)"},
	{Kind: KindOutcomeUnknown, Hint: "fleet-send --status MSG_ID tells once it is known; fleet-send --id MSG_ID sends it again as the same message, at most once"},
	{Kind: KindBadCert, Hint: "make it again where it came from (fleet-gw cert request on the host, fleet-gw operator certify or revoke on the operator's machine) and pass the whole line"},
	{Kind: KindUntrustedHost, Hint: "trust that host (fleet-gw trust add 'HOST KEY' with the line fleet-gw key prints there), or certify it (fleet-security(7))"},
	{Kind: KindRefusedByHost, Hint: "the message names the host and its reason: fix that there (fleet-security(7) says what each reason means), then send again"},
	{Kind: KindNoSealKey, Hint: "on that host run `fleet-gw key`, then here: fleet-gw trust add HOST SIGNING-KEY SEALING-KEY with the line it prints (or, to send it text the broker can read, name the host in plaintext-hosts or set seal-fallback = clear, fleet-config(5))"},
	{Kind: KindLoop, Hint: "do not answer it again: the trace is a loop, past the gateway's max-hops (fleet-config(5)); fleet-trace TRACE_ID shows where it was cut, and a new flow starts with a plain fleet-send NAME TEXT"},
	{Kind: KindRateLimited, Hint: "wait the time named above, then send again; the limits are the gateway's pair-rate and urgent-rate (fleet-config(5))"},
	{Kind: KindLocalOnly, Hint: "do not run fleet-bcast again (this host's members would get it twice): once the broker is back (fleet-gw status), reach the members on other hosts with fleet-send NAME@HOST"},
}

// kindInfo is KindTable by kind.
var kindInfo = map[Kind]KindInfo{}

func init() {
	for _, ki := range KindTable {
		Kinds[ki.Kind] = true
		kindInfo[ki.Kind] = ki
	}
}

// Info returns k's line of KindTable.
func (k Kind) Info() KindInfo { return kindInfo[k] }
