package gateway

// control.go — the control plane (U4): fleet-spawn and fleet-stop. The
// requesting side is control_request.go, the executing side (on the target
// host) control_exec.go; this file holds what both speak.
//
// The requester is an entity (its credential, as for fleet-send). Its
// gateway turns the call into a SPAWN or STOP envelope whose msg id is the
// request id, and:
//
//   - target host = this host: carries it out here, broker or not;
//   - otherwise publishes it to bridge.control, key = the target host
//     (mandatory, confirmed: unroutable = no such host, 67), expiring at the
//     caller's deadline, and waits. The target gateway consumes it from its
//     control.<host> queue, carries it out and publishes the answer
//     (SPAWN_RESULT / STOP_RESULT, in reply to the request id) to bridge.msg
//     with key = the requester's gid: it arrives on the requester's own
//     inbox consumer, where the intake (intake.go) hands it to the waiting call. An
//     answer is never stored in an inbox: nobody waiting (the caller gave
//     up, or a duplicate answer) means it is logged and dropped.
//
// The answer rides the requester's inbox because that queue already exists,
// is bound by gid, and is consumed by exactly the gateway that waits: no
// reply queue to declare, name or clean up, and the broker's mandatory flag
// tells the target at once if the requester is gone.
//
// Each request id is carried out once per host (store: BeginControl): a
// redelivered SPAWN, or the same --request-id sent again, is answered from
// the record, with the same gid. A spawn that failed cleanly leaves no
// record (nothing was started), so it may be tried again; one cut short by
// a crash is answered "uncertain" for good, never started twice.

import (
	"regexp"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

// defaultControlTimeout bounds a spawn or stop when the caller gives none.
const defaultControlTimeout = 30 * time.Second

// spawnBody is the body of a SPAWN.
type spawnBody struct {
	Name    string   `json:"name"`
	Profile string   `json:"profile"`
	Groups  []string `json:"groups,omitempty"`
	Args    []string `json:"args,omitempty"`
}

// stopBody is the body of a STOP.
type stopBody struct {
	Gid  string `json:"gid"`
	Name string `json:"name,omitempty"`
}

// controlResult is the body of a SPAWN_RESULT or STOP_RESULT, and what the
// control record keeps as the answer.
type controlResult struct {
	RequestID string         `json:"request_id"`
	Spawned   *api.Spawned   `json:"spawned,omitempty"`
	Stopped   *api.Stopped   `json:"stopped,omitempty"`
	Error     *api.ErrorBody `json:"error,omitempty"`
}

func failed(id string, err error) *controlResult {
	return &controlResult{RequestID: id, Error: api.FromFault(err)}
}

var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
