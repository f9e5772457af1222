package fleet_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rogpeppe/go-internal/testscript"
)

// The broker scripts (broker_*.txtar, outage_*.txtar) run against the
// private RabbitMQ node of scripts/rabbitmq-node.sh: `make test` starts it
// and passes its URL in FLEET_TEST_BROKER; without that the first broker
// script starts it. Each script gets its own vhost, so scripts running in
// parallel never share a queue. The outage scripts stop, block or pause
// the whole node, so they take the broker exclusively.

// brokerLock orders the scripts of this process: the outage scripts take
// it exclusively (across processes, testnode.Lock does the same).
var brokerLock sync.RWMutex

func rabbitmqctl(args ...string) ([]byte, error) { return testnode.Ctl(args...) }

// setupBroker gives a broker script its vhost and lock.
func setupBroker(env *testscript.Env, name string) error {
	exclusive := strings.HasPrefix(name, "outage_")
	if !exclusive && !strings.HasPrefix(name, "broker_") {
		return nil
	}
	if exclusive {
		brokerLock.Lock()
		env.Defer(brokerLock.Unlock)
	} else {
		brokerLock.RLock()
		env.Defer(brokerLock.RUnlock)
	}
	// and across processes: the in-process broker tests of other packages
	// (pkg/gateway) run beside this one
	unlock, err := testnode.Lock(exclusive)
	if err != nil {
		return err
	}
	env.Defer(unlock)
	vhost := "t-" + name
	vhostURL, drop, err := testnode.Vhost(vhost)
	if err != nil {
		return err
	}
	env.Defer(func() {
		if exclusive { // leave the node as we found it
			rabbitmqctl("set_vm_memory_high_watermark", "0.4")
			rabbitmqctl("start_app")
		}
		drop()
	})
	tlsURL, _ := testnode.Node("tls-url")
	tlsDir, _ := testnode.Node("tls-dir")
	env.Setenv("BROKER_TLS_URL", strings.TrimSpace(string(tlsURL))+vhost)
	env.Setenv("TLS_DIR", strings.TrimSpace(string(tlsDir)))
	env.Setenv("FLEET_BROKER", vhostURL)
	env.Setenv("BROKER_URL", vhostURL)
	// the product's default: a 2-core machine running the suite's
	// parallel scripts beside the agent CLIs stalled a gateway's reads
	// past 3 x 2s (two scripts lost their connection to "i/o timeout");
	// a script about heartbeats sets its own (broker_exclusive, _unknown)
	env.Setenv("FLEET_HEARTBEAT", "5s")
	if node, err := testnode.Script(); err == nil {
		// for fleet-gw broker-setup; a script's environment is its own,
		// so a node other than the default (FLEET_RMQ_NODE, _DIR, _PORT:
		// a second checkout's run beside another) is named on the line
		ctl := node + " ctl"
		var pin []string
		for _, k := range []string{"FLEET_RMQ_NODE", "FLEET_RMQ_DIR", "FLEET_RMQ_PORT"} {
			if v := os.Getenv(k); v != "" {
				pin = append(pin, k+"="+v)
			}
		}
		if len(pin) > 0 {
			ctl = "env " + strings.Join(pin, " ") + " " + ctl
		}
		env.Setenv("FLEET_RABBITMQCTL", ctl)
	}
	env.Values["dlq"] = &dlqStash{}
	env.Values["logins"] = map[string]*url.Userinfo{}
	// every gateway runs with its own least-privilege login ("host"
	// below): in normal operation none may meet a broker refusal
	env.Defer(func() {
		if _, err := os.Stat(filepath.Join(env.WorkDir, "expect-refusals")); err == nil {
			return // the script takes a login away on purpose
		}
		logs, _ := filepath.Glob(filepath.Join(env.WorkDir, "*.log"))
		for _, l := range logs {
			data, _ := os.ReadFile(l)
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, "ACCESS_REFUSED") {
					env.T().Fatal(fmt.Sprintf("%s: a gateway, with its own broker login, met a permission error: %s", filepath.Base(l), line))
				}
			}
		}
	})
	return nil
}

// hostLogin is host's own broker login for this script's vhost, made once
// as fleet-gw broker-setup makes it (testnode.Login: the same definitions,
// in one rabbitmqctl call for h1 and h2 together, where broker-setup
// makes three per host, each starting an Erlang VM). The scripts that are
// about broker-setup (broker_setup, broker_dlq, join_bundle ...) run the
// real command.
func hostLogin(ts *testscript.TestScript, host string) *url.Userinfo {
	logins := ts.Value("logins").(map[string]*url.Userinfo)
	if u, ok := logins[host]; ok {
		return u
	}
	base := ts.Getenv("BROKER_URL")
	if err := testnode.Logins(base, host, "h1", "h2"); err != nil {
		ts.Fatalf("broker login of %s: %v", host, err)
	}
	login, err := testnode.Login(base, host)
	ts.Check(err)
	u, err := url.Parse(login)
	ts.Check(err)
	logins[host] = u.User
	return u.User
}

// dlqStash holds what "amqp refused" took from bridge.dlq and did not
// match yet, so refusals can be checked one by one in any order.
type dlqStash struct {
	msgs []amqp.Delivery
}

// host NAME — point FLEET_HOST, FLEET_SOCKET and FLEET_STATE_DIR at host
// NAME's gateway, so "gw start NAME" and the commands after it act there;
// in a broker script, FLEET_BROKER then carries NAME's own broker login.
func cmdHost(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: host NAME")
	}
	work := ts.Getenv("WORK")
	ts.Setenv("FLEET_HOST", args[0])
	ts.Setenv("FLEET_SOCKET", filepath.Join(work, args[0]+".sock"))
	ts.Setenv("FLEET_STATE_DIR", filepath.Join(work, args[0]))
	// with a broker, the host's own login (same address: plain, TLS or
	// through a proxy), never guest
	if ts.Getenv("BROKER_URL") != "" {
		if u, err := url.Parse(ts.Getenv("FLEET_BROKER")); err == nil && u.User != nil && trust.HostRE.MatchString(args[0]) {
			u.User = hostLogin(ts, args[0])
			ts.Setenv("FLEET_BROKER", u.String())
		}
	}
}

// enrol HOST... — enrol the hosts with each other the way the README tells
// an operator to: on each host `fleet-gw key`, then on every other host
// `fleet-gw trust add` with the line it printed. The real binaries, each
// host with its own state folder and trust file (FLEET_TRUST_FILE, when
// the script sets it, is shared by all).
func cmdEnrol(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: enrol HOST HOST...")
	}
	work := ts.Getenv("WORK")
	run := func(host string, argv ...string) string {
		cmd := exec.Command(filepath.Join(binDir, "fleet-gw"), argv...)
		env := scriptEnv(ts)
		env = append(env, "FLEET_HOST="+host, "FLEET_STATE_DIR="+filepath.Join(work, host),
			"FLEET_SOCKET="+filepath.Join(work, host+".sock"))
		cmd.Env = env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			ts.Fatalf("fleet-gw %s on %s: %v\n%s", strings.Join(argv, " "), host, err, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	lines := map[string]string{}
	for _, h := range args {
		lines[h] = run(h, "key")
	}
	for _, h := range args {
		for _, other := range args {
			if other != h {
				run(h, "trust", "add", lines[other])
			}
		}
	}
	// gateways already running reread their trust files and say so in
	// their next presence: wait (up to 30 s) until each running one hears
	// that each other running one admits it, so a send right after the
	// enrolment is not refused by the sender's own stale pre-check
	deadline := time.Now().Add(30 * time.Second)
	for _, h := range args {
		for _, other := range args {
			if other == h {
				continue
			}
			want := "peer      " + other + " live, trusted, admits this host"
			for {
				cmd := exec.Command(filepath.Join(binDir, "fleet-gw"), "status")
				cmd.Env = append(scriptEnv(ts), "FLEET_HOST="+h, "FLEET_STATE_DIR="+filepath.Join(work, h),
					"FLEET_SOCKET="+filepath.Join(work, h+".sock"))
				out, err := cmd.Output()
				if err != nil || !strings.Contains(string(out), "peer      "+other+" ") {
					break // h's gateway is not running, or has not heard other at all yet: nothing to settle
				}
				if strings.Contains(string(out), want) || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// broker stop|start|block|unblock|closeall — act on the node (outage
// scripts only; block and unblock return once the node has raised or
// cleared its memory alarm, so publishers are blocked from then on);
// broker queues — print this script's queues: name, ready,
// unacknowledged, consumers.
//
// broker store MARKER — look for MARKER in every file of the node's data
// folder (its message stores and queue indexes: what a disk or a backup
// of the broker holds); print the files that hold it. With !, none may.
func cmdBroker(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) == 2 && args[0] == "store" {
		brokerStore(ts, neg, args[1])
		return
	}
	if len(args) != 1 {
		ts.Fatalf("usage: broker stop|start|block|unblock|closeall|queues|store MARKER")
	}
	var out []byte
	var err error
	switch args[0] {
	case "stop":
		out, err = rabbitmqctl("stop_app")
	case "start":
		out, err = rabbitmqctl("start_app")
	case "block":
		out, err = rabbitmqctl("set_vm_memory_high_watermark", "0.0000001")
		if err == nil {
			awaitMemoryAlarm(ts, true)
		}
	case "unblock":
		out, err = rabbitmqctl("set_vm_memory_high_watermark", "0.4")
		if err == nil {
			awaitMemoryAlarm(ts, false)
		}
	case "closeall":
		u, perr := url.Parse(ts.Getenv("BROKER_URL"))
		ts.Check(perr)
		out, err = rabbitmqctl("close_all_connections", "-p", strings.TrimPrefix(u.Path, "/"), "test: connections cut")
	case "queues":
		u, perr := url.Parse(ts.Getenv("BROKER_URL"))
		ts.Check(perr)
		out, err = rabbitmqctl("list_queues", "-q", "--no-table-headers", "-p", strings.TrimPrefix(u.Path, "/"),
			"name", "messages_ready", "messages_unacknowledged", "consumers")
		fmt.Fprint(ts.Stdout(), string(out))
	default:
		ts.Fatalf("unknown broker command %q", args[0])
	}
	if err != nil {
		ts.Fatalf("rabbitmqctl %s: %v\n%s", args[0], err, out)
	}
}

// brokerStore is "broker store MARKER".
func brokerStore(ts *testscript.TestScript, neg bool, marker string) {
	tlsDir, err := testnode.Node("tls-dir") // $dir/tls, beside $dir/mnesia
	ts.Check(err)
	data := filepath.Join(filepath.Dir(strings.TrimSpace(string(tlsDir))), "mnesia")
	var found []string
	files := 0
	err = filepath.WalkDir(data, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil // a file the node removed meanwhile
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		files++
		if strings.Contains(string(b), marker) {
			rel, _ := filepath.Rel(data, path)
			found = append(found, rel)
		}
		return nil
	})
	ts.Check(err)
	if files == 0 {
		ts.Fatalf("no file in the node's data folder %s", data)
	}
	for _, f := range found {
		fmt.Fprintln(ts.Stdout(), f)
	}
	switch {
	case neg && len(found) > 0:
		ts.Fatalf("%q is readable in %d files of the broker's data folder: %v", marker, len(found), found)
	case !neg && len(found) == 0:
		ts.Fatalf("%q is in none of the %d files of the broker's data folder", marker, files)
	}
}

func amqpDial(ts *testscript.TestScript) (*amqp.Connection, *amqp.Channel) {
	conn, err := amqp.Dial(ts.Getenv("BROKER_URL"))
	ts.Check(err)
	ch, err := conn.Channel()
	ts.Check(err)
	return conn, ch
}

// amqp exchange NAME TYPE|delete — declare (or delete) an exchange.
// amqp publish EXCHANGE KEY BODY — publish raw bytes (a poison message);
// KEY (and QUEUE below) may be @FILE, read from a file. In a body, @NOW@
// becomes the current time and @SOON@ a minute from now (RFC 3339), so a
// forged envelope is fresh.
// amqp count QUEUE — print the number of messages ready in QUEUE.
// amqp get QUEUE — take one message and print its headers and body.
// amqp args QUEUE — print the queue's x-max-length as the broker sees it
// (by publishing nothing: a passive declare cannot tell, so this counts).
func fillTimes(body string) string {
	now := time.Now().UTC()
	body = strings.ReplaceAll(body, "@NOW@", now.Format(time.RFC3339Nano))
	return strings.ReplaceAll(body, "@SOON@", now.Add(time.Minute).Format(time.RFC3339Nano))
}

func cmdAMQP(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: amqp publish|count|get ...")
	}
	conn, ch := amqpDial(ts)
	defer conn.Close()
	switch args[0] {
	case "exchange": // amqp exchange NAME TYPE|delete — as the node's admin
		if len(args) != 3 {
			ts.Fatalf("usage: amqp exchange NAME TYPE|delete")
		}
		if args[2] == "delete" {
			ts.Check(ch.ExchangeDelete(args[1], false, false))
		} else {
			ts.Check(ch.ExchangeDeclare(args[1], args[2], true, false, false, false, nil))
		}
	case "publish":
		if len(args) != 4 {
			ts.Fatalf("usage: amqp publish EXCHANGE KEY BODY")
		}
		key := args[2]
		if strings.HasPrefix(key, "@") { // the key is in a file
			key = strings.TrimSpace(ts.ReadFile(key[1:]))
		}
		body := args[3]
		if strings.HasPrefix(body, "@") {
			body = ts.ReadFile(body[1:])
		}
		body = fillTimes(body)
		ts.Check(ch.Confirm(false))
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), args[1], key, false, false,
			amqp.Publishing{Body: []byte(body), MessageId: "raw", DeliveryMode: amqp.Persistent})
		ts.Check(err)
		if !dc.Wait() {
			ts.Fatalf("publish not confirmed")
		}
	case "publish-signed":
		// amqp publish-signed KEYFILE HOST EXCHANGE KEY @BODY [DIR...] —
		// sign as a gateway would, with the key in KEYFILE, naming HOST;
		// with DIRs (state folders), its body sealed first to their hosts'
		// sealing keys, bound to it as HOST's gateway binds (issue 27)
		if len(args) < 6 {
			ts.Fatalf("usage: amqp publish-signed KEYFILE HOST EXCHANGE KEY @BODY [DIR...]")
		}
		seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(ts.ReadFile(args[1])))
		ts.Check(err)
		key := args[4]
		if strings.HasPrefix(key, "@") {
			key = strings.TrimSpace(ts.ReadFile(key[1:]))
		}
		body := []byte(fillTimes(ts.ReadFile(strings.TrimPrefix(args[5], "@"))))
		if dirs := args[6:]; len(dirs) > 0 {
			body = sealFor(ts, args[2], body, dirs)
		}
		sig := ed25519.Sign(ed25519.NewKeyFromSeed(seed), body)
		ts.Check(ch.Confirm(false))
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), args[3], key, false, false,
			amqp.Publishing{Body: body, MessageId: "signed", DeliveryMode: amqp.Persistent, Headers: amqp.Table{
				"fleet-host": args[2], "fleet-sig": base64.StdEncoding.EncodeToString(sig)}})
		ts.Check(err)
		if !dc.Wait() {
			ts.Fatalf("publish not confirmed")
		}
	case "dead":
		// amqp dead MSGID REASON BODY — a dead letter put straight into
		// bridge.dlq, as any broker login that may publish there could:
		// message id and fleet-reason as given, Go escapes (\x1b) decoded
		if len(args) != 4 {
			ts.Fatalf("usage: amqp dead MSGID REASON BODY")
		}
		unq := func(s string) string {
			u, err := strconv.Unquote(`"` + s + `"`)
			ts.Check(err)
			return u
		}
		ts.Check(ch.Confirm(false))
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "bridge.dlq", false, false,
			amqp.Publishing{Body: []byte(unq(args[3])), MessageId: unq(args[1]), Type: unq(args[1]), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{"fleet-reason": unq(args[2]), "fleet-refused-by": unq(args[2])}})
		ts.Check(err)
		if !dc.Wait() {
			ts.Fatalf("publish not confirmed")
		}
	case "count":
		name := args[1]
		if strings.HasPrefix(name, "@") {
			name = strings.TrimSpace(ts.ReadFile(name[1:]))
		}
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		ts.Check(err)
		fmt.Fprintln(ts.Stdout(), q.Messages)
	case "get":
		d, ok, err := ch.Get(args[1], true)
		ts.Check(err)
		if !ok {
			fmt.Fprintln(ts.Stdout(), "empty")
			return
		}
		for k, v := range d.Headers {
			if k == "x-death" {
				if deaths, ok := v.([]any); ok && len(deaths) > 0 {
					if t, ok := deaths[0].(amqp.Table); ok {
						fmt.Fprintf(ts.Stdout(), "x-death-reason: %v\n", t["reason"])
					}
				}
				continue
			}
			fmt.Fprintf(ts.Stdout(), "%s: %v\n", k, v)
		}
		fmt.Fprintf(ts.Stdout(), "body: %s\n", d.Body)
	case "capture":
		// amqp capture NAME EXCHANGE KEY — a queue of our own, capture.NAME,
		// bound to EXCHANGE with KEY: what an eavesdropper with broker
		// access would record
		if len(args) != 4 {
			ts.Fatalf("usage: amqp capture NAME EXCHANGE KEY")
		}
		q := "capture." + args[1]
		_, err := ch.QueueDeclare(q, false, false, false, false, nil)
		ts.Check(err)
		ts.Check(ch.QueueBind(q, args[3], args[2], false, nil))
	case "clean":
		// amqp clean QUEUE MARKER [keep] — read every message in QUEUE
		// (taken, or with keep given back when done) and fail unless
		// there is at least one and none holds MARKER in its body or a
		// header; print how many were read, by kind (AMQP type)
		if len(args) != 3 && len(args) != 4 {
			ts.Fatalf("usage: amqp clean QUEUE MARKER [keep]")
		}
		keep := len(args) == 4 && args[3] == "keep"
		kinds := map[string]int{}
		n := 0
		for {
			d, ok, err := ch.Get(args[1], !keep)
			ts.Check(err)
			if !ok {
				break
			}
			n++
			kinds[d.Type]++
			if strings.Contains(string(d.Body), args[2]) || strings.Contains(fmt.Sprint(d.Headers), args[2]) {
				ts.Fatalf("%s holds %q readable: type %s, msg id %s: %s", args[1], args[2], d.Type, d.MessageId, d.Body)
			}
		}
		if n == 0 {
			ts.Fatalf("nothing in %s to look at", args[1])
		}
		names := make([]string, 0, len(kinds))
		for k := range kinds {
			names = append(names, k)
		}
		sort.Strings(names)
		fmt.Fprintf(ts.Stdout(), "%d messages:", n)
		for _, k := range names {
			fmt.Fprintf(ts.Stdout(), " %s=%d", k, kinds[k])
		}
		fmt.Fprintln(ts.Stdout())
	case "replay":
		// amqp replay NAME EXCHANGE KEY — take one captured message and
		// publish it again, bytes and headers (signature included) as they
		// were, to EXCHANGE with KEY (@FILE: read from a file)
		if len(args) != 4 {
			ts.Fatalf("usage: amqp replay NAME EXCHANGE KEY")
		}
		key := args[3]
		if strings.HasPrefix(key, "@") {
			key = strings.TrimSpace(ts.ReadFile(key[1:]))
		}
		var d amqp.Delivery
		for deadline := time.Now().Add(15 * time.Second); ; {
			var ok bool
			var err error
			d, ok, err = ch.Get("capture."+args[1], true)
			ts.Check(err)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				ts.Fatalf("nothing captured in capture.%s", args[1])
			}
			time.Sleep(50 * time.Millisecond)
		}
		ts.Check(ch.Confirm(false))
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), args[2], key, false, false,
			amqp.Publishing{Body: d.Body, Headers: d.Headers, MessageId: d.MessageId, Type: d.Type,
				ContentType: d.ContentType, DeliveryMode: amqp.Persistent})
		ts.Check(err)
		if !dc.Wait() {
			ts.Fatalf("publish not confirmed")
		}
	case "refused":
		// amqp refused REASON [REGEXP] — wait (15s) for a message in
		// bridge.dlq refused with fleet-reason REASON (and a body matching
		// REGEXP); print its headers and body.
		// Others taken meanwhile are kept for later checks. With !, no
		// such message may be there now (nothing waited for).
		stash := ts.Value("dlq").(*dlqStash)
		var body *regexp.Regexp
		if len(args) > 2 {
			body = regexp.MustCompile(args[2])
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			for {
				d, ok, err := ch.Get(QDLQ, true)
				ts.Check(err)
				if !ok {
					break
				}
				stash.msgs = append(stash.msgs, d)
			}
			for i, d := range stash.msgs {
				if r, _ := d.Headers["fleet-reason"].(string); r == args[1] && (body == nil || body.Match(d.Body)) {
					if neg {
						ts.Fatalf("bridge.dlq holds a message refused as %s: %s", args[1], d.Body)
					}
					stash.msgs = append(stash.msgs[:i], stash.msgs[i+1:]...)
					keys := make([]string, 0, len(d.Headers))
					for k := range d.Headers {
						keys = append(keys, k)
					}
					sort.Strings(keys)
					for _, k := range keys {
						if k != "x-death" {
							fmt.Fprintf(ts.Stdout(), "%s: %v\n", k, d.Headers[k])
						}
					}
					fmt.Fprintf(ts.Stdout(), "body: %s\n", d.Body)
					return
				}
			}
			if neg {
				return
			}
			if time.Now().After(deadline) {
				var seen []string
				for _, d := range stash.msgs {
					r, _ := d.Headers["fleet-reason"].(string)
					seen = append(seen, r)
				}
				ts.Fatalf("no message refused as %s in bridge.dlq within 15s (there: %v)", args[1], seen)
			}
			time.Sleep(50 * time.Millisecond)
		}
	default:
		ts.Fatalf("unknown amqp command %q", args[0])
	}
}

// sealFor is raw, an envelope, with its body sealed to the hosts whose
// state folders are dirs, bound to its kind, msg id and signing host.
func sealFor(ts *testscript.TestScript, host string, raw []byte, dirs []string) []byte {
	var env envelope.Envelope
	ts.Check(envelope.Unmarshal(raw, &env))
	var to []*seal.Recipient
	for _, d := range dirs {
		ring, err := seal.LoadKeyring(ts.MkAbs(d))
		ts.Check(err)
		to = append(to, ring.Public())
	}
	sealed, err := seal.Seal(seal.Bind(string(env.Kind), env.MsgID, host), []byte(env.Body), to)
	ts.Check(err)
	env.Sealed, env.Body = sealed, ""
	out, err := envelope.Encode(&env)
	ts.Check(err)
	return out
}

// awaitMemoryAlarm waits (30s) until the node's memory alarm is raised
// (on) or cleared: the watermark is only compared at the node's next
// memory check.
func awaitMemoryAlarm(ts *testscript.TestScript, on bool) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := rabbitmqctl("eval", "rabbit_alarm:get_alarms().")
		ts.Check(err)
		if strings.Contains(string(out), "memory") == on {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("memory alarm not %v within 30s: %s", map[bool]string{true: "raised", false: "cleared"}[on], out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// QDLQ is the broker's dead-letter queue.
const QDLQ = "bridge.dlq"

// proxy start NAME — a TCP proxy in front of the broker; FLEET_BROKER
// then points at it. proxy cut NAME — stop forwarding on every open
// connection without closing it (a silent network: only heartbeats can
// tell), while new connections pass. proxy mute NAME — on every open
// connection, stop forwarding what the broker sends (its confirms
// included) while what the client sends still reaches it: a one-way cut.
// proxy count NAME — print how many connections it carried.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []*proxyConn
	total  int
}

type proxyConn struct {
	a, b net.Conn
	cut  chan struct{} // both ways
	mute chan struct{} // broker to client only
}

func (p *proxy) serve() {
	for {
		a, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			a.Close()
			continue
		}
		pc := &proxyConn{a: a, b: b, cut: make(chan struct{}), mute: make(chan struct{})}
		p.mu.Lock()
		p.conns = append(p.conns, pc)
		p.total++
		p.mu.Unlock()
		never := make(chan struct{})
		pipe := func(dst, src net.Conn, mute chan struct{}) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				select {
				case <-pc.cut:
					// swallow everything, close nothing
					if err != nil {
						return
					}
					continue
				case <-mute:
					// swallow everything, close nothing
					if err != nil {
						return
					}
					continue
				default:
				}
				if n > 0 {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					if err != io.EOF {
						dst.Close()
					}
					dst.Close()
					return
				}
			}
		}
		go pipe(b, a, never)
		go pipe(a, b, pc.mute)
	}
}

// startProxy listens on a loopback port of its own and forwards every
// connection to target; stop closes the listener and every connection.
func startProxy(target string) (p *proxy, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	p = &proxy{ln: ln, target: target}
	go p.serve()
	return p, func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.a.Close()
			c.b.Close()
		}
		p.mu.Unlock()
	}, nil
}

// silence stops forwarding on every open connection without closing it:
// what the broker sends only (oneWay), or both ways. New connections pass.
func (p *proxy) silence(oneWay bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		ch := c.cut
		if oneWay {
			ch = c.mute
		}
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
	p.conns = nil
}

func cmdProxy(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: proxy start|cut|mute|count NAME")
	}
	key := "proxy-" + args[1]
	switch args[0] {
	case "start":
		u, err := url.Parse(ts.Getenv("FLEET_BROKER")) // the current host's login
		ts.Check(err)
		p, stop, err := startProxy(u.Host)
		ts.Check(err)
		ts.Value("proxies").(map[string]*proxy)[key] = p
		ts.Defer(stop)
		u.Host = p.ln.Addr().String()
		ts.Setenv("FLEET_BROKER", u.String())
	case "cut":
		ts.Value("proxies").(map[string]*proxy)[key].silence(false)
	case "mute":
		ts.Value("proxies").(map[string]*proxy)[key].silence(true)
	case "count":
		p := ts.Value("proxies").(map[string]*proxy)[key]
		p.mu.Lock()
		fmt.Fprintln(ts.Stdout(), p.total)
		p.mu.Unlock()
	default:
		ts.Fatalf("unknown proxy command %q", args[0])
	}
}
