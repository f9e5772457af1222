// Package fault carries the one error type every layer of fleet returns:
// an error with a stable kind, a sysexits-style exit code and an optional
// hint naming the next command to run. Only the edge (pkg/cli) turns a
// fault into an exit status; nothing below main calls os.Exit.
package fault

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Code is a process exit status, sysexits-style.
type Code int

// Exit codes. The table is part of the public contract: codes are only ever
// added, never renumbered; what each means and whether a retry may help is
// said once, in Codes (codes.go), which the man pages render.
const (
	OK           Code = 0
	AskArrived   Code = 10 // not a failure: an ASK to the caller ended its wait for a reply; answer it, then wait again
	TooLate      Code = 11 // fleet's own: the ask is over; the answer was not delivered and never will be
	Partial      Code = 12 // fleet's own (fleet-bcast): delivered to some members, not all; running it again would duplicate
	Usage        Code = 64 // EX_USAGE: bad flags or arguments, ambiguous name
	Data         Code = 65 // EX_DATAERR: empty, non-UTF-8 or oversized body, bad frame
	NoRecipient  Code = 67 // EX_NOUSER: no such recipient, message, entity or trace
	Unavailable  Code = 69 // EX_UNAVAILABLE: no gateway running, broker down
	Software     Code = 70 // EX_SOFTWARE: a bug or an unexpected internal error
	LaunchFailed Code = 71 // EX_OSERR: a launcher could not start or stop an entity's command
	CantCreate   Code = 73 // EX_CANTCREAT: state folder or socket cannot be written
	// OutcomeUnknown: the message may or may not have been sent (a lost
	// broker confirm, a gateway lost mid-send). The msg id is named; a
	// retry with that id (fleet-send --id) is carried out at most once.
	OutcomeUnknown Code = 74
	TempFail       Code = 75 // EX_TEMPFAIL: may succeed when run again: timed out, inbox busy or full, roster settling
	Refused        Code = 77 // EX_NOPERM: bad or missing credential, wrong peer
	Conflict       Code = 78 // EX_CONFIG: the host id or the state folder is another live gateway's
)

// Error is a failure with an exit code, a stable machine-readable kind
// (snake_case, used in JSON and on the socket) and an optional hint.
type Error struct {
	Code Code
	Kind Kind
	Msg  string
	Hint string
	Err  error
	// RetryAfter is, on a refusal that ends by itself (rate_limited),
	// how long to wait before the same call may succeed (0: not said).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Err != nil && e.Msg == "" {
		return e.Err.Error()
	}
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an Error with the given code and kind.
func New(code Code, kind Kind, format string, args ...any) *Error {
	return &Error{Code: code, Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an Error wrapping err.
func Wrap(code Code, kind Kind, err error, format string, args ...any) *Error {
	return &Error{Code: code, Kind: kind, Msg: fmt.Sprintf(format, args...), Err: err}
}

// NotPrivate returns the KindNotPrivate error inside err (nil if none): a
// path refused for its owner, its mode or a link is told as itself, with
// its own fix, however deep the caller found it.
func NotPrivate(err error) *Error {
	var fe *Error
	if errors.As(err, &fe) && fe.Kind == KindNotPrivate {
		return fe
	}
	return nil
}

// WithHint returns e with a hint attached.
func (e *Error) WithHint(format string, args ...any) *Error {
	e.Hint = fmt.Sprintf(format, args...)
	return e
}

// CodeOf returns the exit code err carries, Software for a plain error and
// OK for nil.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	return Software
}

// KindOf returns the kind err carries, KindInternal for a plain error.
func KindOf(err error) Kind {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Kind
	}
	return KindInternal
}

// HintOf returns the hint err carries, if any.
func HintOf(err error) string {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Hint
	}
	return ""
}

// RetryAfterOf returns how long err says to wait before trying again (0:
// it does not say).
func RetryAfterOf(err error) time.Duration {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.RetryAfter
	}
	return 0
}

// HintFor returns the hint err carries, else the default hint of its kind
// (KindTable), with {cmd} replaced by cmd, the command that reports it:
// every error with a next step says it, whichever layer raised it.
func HintFor(err error, cmd string) string {
	if err == nil {
		return ""
	}
	if h := HintOf(err); h != "" {
		return h
	}
	var fe *Error
	if !errors.As(err, &fe) {
		return ""
	}
	return strings.ReplaceAll(kindInfo[fe.Kind].Hint, "{cmd}", cmd)
}

// Kind is a failure's stable, machine-readable name: snake_case, in JSON
// and on the socket. The set is closed — every kind is declared here and
// has its line in KindTable (kinds.go), none is written as a bare string
// elsewhere (a test in this package checks the tree) — and kinds are only
// ever added.
type Kind string

const (
	KindUsage              Kind = "usage"
	KindBadConfig          Kind = "bad_config"
	KindAmbiguous          Kind = "ambiguous_recipient"
	KindNameTaken          Kind = "name_taken"
	KindUnknownProfile     Kind = "unknown_profile"
	KindEmptyBody          Kind = "empty_body"
	KindBodyTooLarge       Kind = "body_too_large"
	KindBadUTF8            Kind = "bad_utf8"
	KindBadFrame           Kind = "bad_frame"
	KindBadEnvelope        Kind = "bad_envelope"
	KindNewerSchema        Kind = "newer_schema"
	KindProtocol           Kind = "protocol"
	KindUnknownRecipient   Kind = "unknown_recipient"
	KindUnknownMessage     Kind = "unknown_message"
	KindUnknownEntity      Kind = "unknown_entity"
	KindUnknownTrace       Kind = "unknown_trace"   // fleet-trace: no host that answered saw the trace id
	KindUnknownHost        Kind = "unknown_host"    // no such host (control plane, trust file)
	KindRosterSettling     Kind = "roster_settling" // a name not known yet, while the roster still fills after connecting
	KindNoGateway          Kind = "no_gateway"
	KindBrokerDown         Kind = "broker_down"
	KindBrokerBlocked      Kind = "broker_blocked"
	KindShuttingDown       Kind = "shutting_down"
	KindSlowWatcher        Kind = "slow_watcher" // a watch stream read too slowly: dropped
	KindInternal           Kind = "internal"
	KindLaunchFailed       Kind = "launch_failed"
	KindSpawnUncertain     Kind = "spawn_uncertain"
	KindStateDir           Kind = "state_dir"
	KindOutput             Kind = "output"
	KindGatewayLocked      Kind = "gateway_running"
	KindHostTaken          Kind = "host_taken" // another live gateway holds this host id on the broker
	KindTimeout            Kind = "timeout"
	KindBrokerTimeout      Kind = "broker_timeout" // no confirm in time: the outcome is unknown
	KindBrokerRefused      Kind = "broker_refused"
	KindInboxFull          Kind = "inbox_full"
	KindInboxBusy          Kind = "inbox_busy"
	KindTooLate            Kind = "too_late"
	KindTooManyConnections Kind = "too_many_connections"
	KindBadCredential      Kind = "bad_credential"
	KindNoCredential       Kind = "no_credential"
	KindNotAgent           Kind = "not_an_agent"
	KindHooksBlocked       Kind = "hooks_blocked"
	KindSandboxed          Kind = "sandboxed"
	KindPeer               Kind = "peer_refused"
	KindBrokerLogin        Kind = "broker_login_refused" // the broker refused this gateway's login or its permissions
	KindAskArrived         Kind = "ask_arrived"          // an ASK to the caller arrived while it waited for a reply
	KindNotAuthentic       Kind = "not_authentic"        // a dead letter to replay whose signature does not prove its sender
	KindNotReplayable      Kind = "not_replayable"       // a dead letter this host may not or cannot deliver again
	KindNotPrivate         Kind = "not_private"          // a state folder, file or socket that is not this user's alone, or a link
	KindHostGone           Kind = "host_gone"            // the recipient's host reads stale or gone: an ask could not be answered
	KindNotAccepted        Kind = "not_accepted"         // the recipient's inbound policy does not accept the sender (fleet-roster accept)
	KindOutcomeUnknown     Kind = "outcome_unknown"      // sent or not is unknown (a confirm lost with the connection, the gateway lost mid-send)
	KindBadCert            Kind = "bad_certificate"      // an enrolment request, host certificate or revocation list that does not read or verify
	KindUntrustedHost      Kind = "untrusted_host"       // a name only a host this gateway does not trust announces, or NAME@HOST of such a host
	KindLocalOnly          Kind = "local_only"           // fleet-bcast: delivered on this host, the other hosts not reached
	KindRefusedByHost      Kind = "refused_by_host"      // the recipient's host refused the message or request (not admitted, bad signature, ...)
	KindNoSealKey          Kind = "no_seal_key"          // hosts that announce no sealing key, neither plaintext-hosts nor seal-fallback = clear allowing them: nothing is sent
	KindLoop               Kind = "loop"                 // the message's trace is past max-hops: a reply loop, cut here
	KindRateLimited        Kind = "rate_limited"         // over pair-rate (one entity to another a minute) or urgent-rate (one entity's urgent messages a minute): nothing is queued
)

// Kinds is the closed set: the kinds of KindTable (kinds.go).
var Kinds = map[Kind]bool{}

// Known reports whether k is in the closed set.
func (k Kind) Known() bool { return Kinds[k] }
