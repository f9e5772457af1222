package fault

// Retry says what running the same command again may do: the one thing a
// script needs to know of an exit status besides success.
type Retry string

const (
	RetryNone  Retry = ""      // success, or not a failure
	RetryYes   Retry = "yes"   // may succeed as it is, later (75)
	RetryAfter Retry = "after" // may succeed once what is named is back or mended (a gateway, the broker)
	RetryNo    Retry = "no"    // fails the same way until the command, a setting or a credential changes
	RetryNever Retry = "never" // the moment has passed, or part of it is done: running it again is wrong
)

// CodeInfo is one line of the exit-status table.
type CodeInfo struct {
	Code  Code
	Retry Retry
	Text  string
}

// Codes is the exit-status table, the one place it is written: fleet(7)
// and every command's EXIT STATUS render it (pkg/docs), and a test checks
// that every Code constant has its line. Codes are only ever added.
var Codes = []CodeInfo{
	{OK, RetryNone, "Success."},
	{AskArrived, RetryNone, "Not a failure (fleet-send --wait, --wait-reply): an ask to you came before the reply and is printed; answer it with fleet-send --answer, then wait again with fleet-send --wait-reply."},
	{TooLate, RetryNever, "Too late (kind too_late): the ask is over (the asker stopped waiting, or its TTL passed) and the answer was not delivered; answering again is refused the same way. Send it as a plain message instead."},
	{Partial, RetryNever, "Delivered in part (fleet-bcast): the members on this host have the message and the other hosts were not reached, the broker down or silent (kind local_only; with --json, \"other_hosts\":\"not_reached\"), or every member has it but those on other hosts whose inbox is full (kind inbox_full; \"other_hosts\":\"inbox_full\"). Stdout still has the msg id and trace id. Running fleet-bcast again gives the members who have it a second copy: reach the others with fleet-send NAME@HOST."},
	{Usage, RetryNo, "Usage error: bad flags or arguments, an invalid setting or config file, an invalid name, or a name already registered here or on another trusted host (kind name_taken)."},
	{Data, RetryNo, "Data error: an empty, non-UTF-8 or oversized message body, a bad envelope or frame, or a protocol mismatch; fleet-gw cert and operator: an enrolment request, certificate or revocation list that does not read or fit (kind bad_certificate)."},
	{NoRecipient, RetryNo, "No such recipient, message or entity; a name only a host this gateway does not trust announces, or NAME@HOST of such a host (kind untrusted_host); fleet-trace: no host that answered saw the trace id."},
	{Unavailable, RetryAfter, "Unavailable: no gateway is running on the socket, the gateway was lost, or it is shutting down; the broker is down and nothing was written to it (not sent); fleet-ask: the askee's host reads stale or gone (kind host_gone; --wait-for-host asks anyway)."},
	{Software, RetryNo, "Internal error: a bug in fleet."},
	{LaunchFailed, RetryAfter, "Launch failed (fleet-spawn, fleet-stop): the launcher of the target host could not start the entity's command, the command died at once (its output is in the message), or its process could not be stopped."},
	{CantCreate, RetryAfter, "Cannot create: the state folder, the socket or the output cannot be created or written."},
	{OutcomeUnknown, RetryNever, "Outcome unknown: the message may or may not have been sent (the broker connection was lost before it confirmed the message, or the command lost its gateway mid-send). The error names the msg id; fleet-send --status MSG_ID tells once it is known, and fleet-send --id MSG_ID retries it as the same message, sent at most once."},
	{TempFail, RetryYes, "Try again: the same command may succeed later. Timed out (kind timeout), an inbox is busy (another fleet-recv drains it) or full, the roster still fills after connecting to the broker (roster_settling), the gateway's connections are all taken; the sender has used up its pair-rate of messages a minute to this recipient, or its urgent-rate of urgent messages a minute (kind rate_limited: the error names the time to wait, with --json also retry_after_ms; nothing was stored or queued); fleet-gw status: degraded; fleet-trace: a host did not answer in time (what came is printed, the silent hosts are named)."},
	{Refused, RetryNo, "Refused: a missing, malformed or invalid credential (one of another host included), or a peer of another user; a recipient whose inbound policy does not accept the sender (kind not_accepted, naming its policy: nothing is stored or published); a message past max-hops in its trace (kind loop: a reply loop cut, nothing delivered, the cut recorded in the trace; a new flow is a plain fleet-send); a host that says it does not admit this one (a send fails before it is published); a host with no sealing key that plaintext-hosts does not name (kind no_seal_key: nothing is published); fleet-ask, fleet-spawn, fleet-stop: the recipient's host refused the ask or request (kind refused_by_host, with its reason); fleet-gw: the broker refused its login, an operator key in a gateway state folder, or a revocation list not signed by a trusted operator."},
	{Conflict, RetryNo, "Conflict (fleet-gw run): another live gateway holds this host id on the broker (host_taken), or this state folder or socket (gateway_running). Running it again fails the same way until that gateway stops or this one gets its own --host or --state-dir."},
}

// Info returns c's line of the table (ok false for a code not in it).
func (c Code) Info() (CodeInfo, bool) {
	for _, ci := range Codes {
		if ci.Code == c {
			return ci, true
		}
	}
	return CodeInfo{}, false
}
