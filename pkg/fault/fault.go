// Package fault carries the one error type every layer of fleet returns:
// an error with a stable kind, a sysexits-style exit code and an optional
// hint naming the next command to run. Only the edge (pkg/cli) turns a
// fault into an exit status; nothing below main calls os.Exit.
package fault

import (
	"errors"
	"fmt"
)

// Code is a process exit status, sysexits-style.
type Code int

// Exit codes. The table is part of the public contract: codes are only ever
// added, never renumbered.
const (
	OK          Code = 0
	Usage       Code = 64 // EX_USAGE: bad flags or arguments, ambiguous name
	Data        Code = 65 // EX_DATAERR: empty, non-UTF-8 or oversized body, bad frame
	NoRecipient Code = 67 // EX_NOUSER: no such recipient, message or entity
	Unavailable Code = 69 // EX_UNAVAILABLE: no gateway running, broker down
	Software    Code = 70 // EX_SOFTWARE: a bug or an unexpected internal error
	CantCreate  Code = 73 // EX_CANTCREAT: state folder or socket cannot be written
	TempFail    Code = 75 // EX_TEMPFAIL: timed out, inbox busy or full, try again
	Refused     Code = 77 // EX_NOPERM: bad or missing credential, wrong peer
)

// Error is a failure with an exit code, a stable machine-readable kind
// (snake_case, used in JSON and on the socket) and an optional hint.
type Error struct {
	Code Code
	Kind string
	Msg  string
	Hint string
	Err  error
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
func New(code Code, kind, format string, args ...any) *Error {
	return &Error{Code: code, Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an Error wrapping err.
func Wrap(code Code, kind string, err error, format string, args ...any) *Error {
	return &Error{Code: code, Kind: kind, Msg: fmt.Sprintf(format, args...), Err: err}
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

// KindOf returns the kind err carries, "internal" for a plain error.
func KindOf(err error) string {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Kind
	}
	return "internal"
}

// HintOf returns the hint err carries, if any.
func HintOf(err error) string {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Hint
	}
	return ""
}

// Kinds used across packages. Kept here so the socket, the CLI and the
// docs agree on the spelling.
const (
	KindUsage            = "usage"
	KindEmptyBody        = "empty_body"
	KindBodyTooLarge     = "body_too_large"
	KindBadUTF8          = "bad_utf8"
	KindBadFrame         = "bad_frame"
	KindBadEnvelope      = "bad_envelope"
	KindNewerSchema      = "newer_schema"
	KindUnknownRecipient = "unknown_recipient"
	KindUnknownMessage   = "unknown_message"
	KindUnknownEntity    = "unknown_entity"
	KindNameTaken        = "name_taken"
	KindNoGateway        = "no_gateway"
	KindGatewayLocked    = "gateway_running"
	KindStateDir         = "state_dir"
	KindTimeout          = "timeout"
	KindInboxBusy        = "inbox_busy"
	KindBadCredential    = "bad_credential"
	KindNoCredential     = "no_credential"
	KindPeer             = "peer_refused"
	KindProtocol         = "protocol"
	KindInternal         = "internal"
	KindShuttingDown     = "shutting_down"
	KindBadConfig        = "bad_config"
	KindHostTaken        = "host_taken"   // another live gateway holds this host id on the broker
	KindUnknownHost      = "unknown_host" // no such host (control plane, trust file)
)
