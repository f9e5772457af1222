// Package testnode is the tests' way to the private RabbitMQ node of
// scripts/rabbitmq-node.sh: its URL (FLEET_TEST_BROKER, or the node started
// on first use), rabbitmqctl, a vhost of a test's own, and the node's test
// lock. Tests of several packages run as several processes at once, and
// the outage scripts stop and block the node: they take the lock
// exclusively, every other broker test shares it. Only tests import it.
package testnode

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/broker"

	amqp "github.com/rabbitmq/amqp091-go"
)

var (
	once   sync.Once
	url    string
	urlErr error
)

// Script is scripts/rabbitmq-node.sh: "Script() ctl" is the node's
// rabbitmqctl.
func Script() (string, error) { return script() }

// script is scripts/rabbitmq-node.sh, found from the working directory up
// to the module's root.
func script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "scripts", "rabbitmq-node.sh"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testnode: no go.mod above the working directory")
		}
		dir = parent
	}
}

// URL is the node's URL without a vhost: FLEET_TEST_BROKER (make test
// starts the node and sets it), or the node started now.
func URL() (string, error) {
	once.Do(func() {
		if u := os.Getenv("FLEET_TEST_BROKER"); u != "" {
			url = strings.TrimSuffix(u, "/")
			return
		}
		out, err := Node("start")
		if err != nil {
			urlErr = fmt.Errorf("starting the private RabbitMQ node: %v\n%s", err, out)
			return
		}
		u, err := Node("url")
		url, urlErr = strings.TrimSuffix(strings.TrimSpace(string(u)), "/"), err
	})
	return url, urlErr
}

// Node runs the node script with args (start, url, tls-url, ctl ...).
func Node(args ...string) ([]byte, error) {
	s, err := script()
	if err != nil {
		return nil, err
	}
	if len(args) > 0 && (args[0] == "ctl" || args[0] == "start") {
		defer ctlSlot()()
	}
	return exec.Command(s, args...).CombinedOutput()
}

// ctlSlots bounds the rabbitmqctl calls of this process at once. Each
// call is an Erlang node of its own, named at random among a thousand
// names and listening on one of eleven ports (35672-35682): with the
// broker tests in parallel, and two packages at a time, more calls at
// once failed ("unable to perform an operation on node").
var ctlSlots = make(chan struct{}, 3)

// ctlSlot waits for a slot and returns its release.
func ctlSlot() func() {
	ctlSlots <- struct{}{}
	return func() { <-ctlSlots }
}

// Ctl runs rabbitmqctl on the node.
func Ctl(args ...string) ([]byte, error) { return Node(append([]string{"ctl"}, args...)...) }

// ctlIn runs rabbitmqctl on the node with stdin as its standard input.
func ctlIn(stdin string, args ...string) ([]byte, error) {
	s, err := script()
	if err != nil {
		return nil, err
	}
	defer ctlSlot()()
	cmd := exec.Command(s, append([]string{"ctl"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	return cmd.CombinedOutput()
}

// Vhost makes a fresh vhost name for guest and returns its URL and its
// removal; with hosts, their logins too (as Login makes them), in the
// same call.
//
// Each rabbitmqctl call starts an Erlang VM (about a second of CPU, more
// on a loaded machine), and the broker tests make hundreds: so a vhost
// with its logins costs one call to make and one to remove. Whether an
// earlier run left the vhost behind (killed before its removal) is asked
// over AMQP, which is quick: only then is it deleted first. The vhost,
// guest's permissions and the logins are one definitions import. Both
// calls go to the node's management API when it has one (importDefs,
// deleteVhost), and cost no Erlang VM at all.
func Vhost(name string, hosts ...string) (string, func(), error) {
	base, err := URL()
	if err != nil {
		return "", nil, err
	}
	u := base + "/" + name
	if vhostMayExist(u) {
		deleteVhost(name)
	}
	loginsMu.Lock()
	forgetLogins(u) // of a vhost of this name made before
	defs, made, err := loginDefs(u, hosts)
	loginsMu.Unlock()
	if err != nil {
		return "", nil, err
	}
	type obj = map[string]any
	if defs == nil {
		defs = obj{"vhosts": []any{obj{"name": name}}}
	}
	perms, _ := defs["permissions"].([]any)
	defs["permissions"] = append(perms, obj{"user": "guest", "vhost": name, "configure": ".*", "write": ".*", "read": ".*"})
	if err := importDefs(defs); err != nil {
		return "", nil, fmt.Errorf("vhost %s: %v", name, err)
	}
	// the import is applied when rabbitmqctl returns on the versions we
	// run, though it says "asynchronous": wait for proof
	if err := canOpen(u); err != nil {
		return "", nil, fmt.Errorf("vhost %s: guest cannot open it: %v", name, err)
	}
	loginsMu.Lock()
	err = proveLogins(u, made)
	loginsMu.Unlock()
	if err != nil {
		return "", nil, err
	}
	return u, func() {
		loginsMu.Lock()
		forgetLogins(u)
		loginsMu.Unlock()
		if !later.Load() {
			deleteVhost(name) // its permissions go with it: so do the logins made in it
			return
		}
		drops.Add(1)
		go func() {
			defer drops.Done()
			// under the shared lock of its own: an outage script
			// waiting for the lock goes first, its node restored after
			if unlock, err := Lock(false); err == nil {
				defer unlock()
			}
			deleteVhost(name)
		}()
	}, nil
}

var (
	later atomic.Bool
	drops sync.WaitGroup
)

// DropLater makes the removals of vhosts (Vhost's drop) return at once
// and remove the vhost in the background, beside what the tests do next
// (delete_vhost is a rabbitmqctl call: a second or more); the returned
// function waits for the removals begun, for TestMain to call after the
// tests. A removal a killed run leaves undone is made by the next Vhost
// of the same name.
func DropLater() (wait func()) {
	later.Store(true)
	return drops.Wait
}

// forgetLogins forgets the logins made in the vhost of u. loginsMu is held.
func forgetLogins(u string) {
	for k := range logins {
		if strings.HasPrefix(k, u+" ") {
			delete(logins, k)
		}
	}
}

// vhostMayExist says whether the vhost of u (guest's URL) may exist: false
// only when the broker says it is not found.
func vhostMayExist(u string) bool {
	c, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err == nil {
		c.Close()
		return true
	}
	var ae *amqp.Error
	return !(errors.As(err, &ae) && ae.Code == amqp.NotAllowed && strings.Contains(ae.Reason, "not found"))
}

// canOpen waits (up to 30s) until a connection to u opens.
func canOpen(u string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Lock takes the node's test lock, shared or exclusive, and returns its
// release. It is a file lock, so tests in other processes respect it.
//
// An exclusive taker waits for the shared holders to finish, and no new
// one starts meanwhile: shared takers first pass through a second lock
// (pending.lock) that a waiting exclusive taker holds. Without it (flock
// prefers nobody) the broker tests of one package, in parallel, could
// keep the lock shared for as long as they run, and an outage script of
// another package (and, behind its in-process lock, every broker script
// there) would wait for all of them.
func Lock(exclusive bool) (func(), error) {
	dir := os.Getenv("FLEET_RMQ_DIR")
	if dir == "" {
		dir = fmt.Sprintf("/tmp/fleet-rmq-%d", os.Getuid())
	}
	pending, err := flockFile(dir, "pending.lock", exclusive)
	if err != nil {
		return nil, err
	}
	if !exclusive {
		pending()
	}
	unlock, err := flockFile(dir, "tests.lock", exclusive)
	if err != nil {
		if exclusive {
			pending()
		}
		return nil, err
	}
	if exclusive {
		return func() { unlock(); pending() }, nil
	}
	return unlock, nil
}

// flock takes dir/tests.lock, shared or exclusive, and returns its release.
func flock(dir string, exclusive bool) (func(), error) {
	return flockFile(dir, "tests.lock", exclusive)
}

// flockFile takes dir/name, shared or exclusive, and returns its release.
func flockFile(dir, name string, exclusive bool) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

var (
	loginsMu sync.Mutex
	logins   = map[string]string{}
)

// Login is host's own broker login in the vhost of vhostURL (a URL from
// Vhost), made once per vhost and host, so a gateway that restarts keeps
// its login.
func Login(vhostURL, host string) (string, error) {
	if err := Logins(vhostURL, host); err != nil {
		return "", err
	}
	loginsMu.Lock()
	defer loginsMu.Unlock()
	return logins[vhostURL+" "+host], nil
}

// Logins makes the logins of hosts in the vhost of vhostURL that Login has
// not made yet, all in one rabbitmqctl call: a test that starts several
// gateways asks for theirs at once (each call starts an Erlang VM).
//
// A login is made from what fleet-gw broker-setup imports (the fleet's
// topology, broker.HostGrant, a random password as broker.HashPassword
// hashes it: broker.Definitions), and proved by logging in with it.
// broker.Provisioner's own checks before the import (an exchange of
// another type, on a vhost of an older version) cannot apply to a vhost
// Vhost made just now; Provision and the broker_setup scripts run it whole.
func Logins(vhostURL string, hosts ...string) error {
	loginsMu.Lock()
	defer loginsMu.Unlock()
	defs, made, err := loginDefs(vhostURL, hosts)
	if err != nil || defs == nil {
		return err
	}
	if err := importDefs(defs); err != nil {
		return fmt.Errorf("provisioning the broker logins of %v: %v", hosts, err)
	}
	return proveLogins(vhostURL, made)
}

// loginDefs are the definitions that make the logins of hosts in the
// vhost of vhostURL that are not made yet (nil if none), and those logins
// by host. loginsMu is held.
func loginDefs(vhostURL string, hosts []string) (map[string]any, map[string]string, error) {
	u, err := neturl.Parse(vhostURL)
	if err != nil {
		return nil, nil, err
	}
	u.User = nil
	_, vhost, err := broker.ParseBase(u.String())
	if err != nil {
		return nil, nil, err
	}
	var all map[string]any
	made := map[string]string{}
	for _, host := range hosts {
		if _, ok := logins[vhostURL+" "+host]; ok {
			continue
		}
		if _, ok := made[host]; ok {
			continue
		}
		var user *neturl.Userinfo
		if all, user, err = addLogin(all, vhost, "", host); err != nil {
			return nil, nil, err
		}
		lu := *u
		lu.User = user
		made[host] = lu.String()
	}
	return all, made, nil
}

// addLogin adds to the definitions all (nil: none yet) what fleet-gw
// broker-setup imports for host in vhost (broker.Definitions: the topology
// with its bridge.dlq of queueType, broker.HostGrant, a random password as
// broker.HashPassword hashes it), and returns them with the login.
func addLogin(all map[string]any, vhost, queueType, host string) (map[string]any, *neturl.Userinfo, error) {
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, nil, err
	}
	password := base64.RawURLEncoding.EncodeToString(raw[:])
	g := broker.HostGrant(vhost, host)
	var d map[string]any
	if err := json.Unmarshal(broker.Definitions(vhost, queueType, &g, broker.HashPassword(password)), &d); err != nil {
		return nil, nil, err
	}
	if all == nil {
		all = d
	} else {
		for _, k := range []string{"users", "permissions", "topic_permissions"} {
			all[k] = append(all[k].([]any), d[k].([]any)...)
		}
	}
	return all, neturl.UserPassword(g.User, password), nil
}

// importDefs imports defs through the node's management API, or with
// rabbitmqctl import_definitions on a node without it.
func importDefs(defs map[string]any) error {
	data, err := json.Marshal(defs)
	if err != nil {
		return err
	}
	if ok, err := viaAPI(http.MethodPost, "/api/definitions", data); ok {
		return err
	}
	if out, err := ctlIn(string(data), "import_definitions"); err != nil {
		return fmt.Errorf("import_definitions: %v\n%s", err, out)
	}
	return nil
}

// deleteVhost removes vhost (its queues, permissions and so the logins
// made in it) through the management API, or with rabbitmqctl.
func deleteVhost(name string) {
	if ok, _ := viaAPI(http.MethodDelete, "/api/vhosts/"+neturl.PathEscape(name), nil); ok {
		return
	}
	Ctl("delete_vhost", name)
}

// The node's management API (scripts/rabbitmq-node.sh management-url):
// a definitions import or a vhost's removal there costs the node a
// request, where rabbitmqctl starts an Erlang VM for it (a second of
// CPU, on a machine the suite keeps busy). "" when the script names none.
var (
	apiOnce sync.Once
	apiBase string
	apiHTTP = &http.Client{Timeout: time.Minute}
)

// viaAPI makes a request of the management API as guest. ok is false when
// there is no API to ask (none named, or nothing listening: a node
// started before the script enabled it), and the caller runs rabbitmqctl
// instead; otherwise err is the API's refusal, if any. A removal of what
// is not there is no refusal.
func viaAPI(method, path string, body []byte) (ok bool, err error) {
	apiOnce.Do(func() {
		if out, err := Node("management-url"); err == nil {
			apiBase = strings.TrimSpace(string(out))
		}
	})
	if apiBase == "" {
		return false, nil
	}
	req, err := http.NewRequest(method, apiBase+path, bytes.NewReader(body))
	if err != nil {
		return true, err
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := apiHTTP.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return false, nil
		}
		return true, fmt.Errorf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 == 2 || (method == http.MethodDelete && resp.StatusCode == http.StatusNotFound) {
		return true, nil
	}
	return true, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, msg)
}

// proveLogins logs in with each login made (by host) and keeps it for
// Login. loginsMu is held.
func proveLogins(vhostURL string, made map[string]string) error {
	for host, login := range made {
		if err := canOpen(login); err != nil {
			return fmt.Errorf("the new broker login of %s does not log in: %v", host, err)
		}
		logins[vhostURL+" "+host] = login
	}
	return nil
}

// Provision makes a login in the vhost of vhostURL the way a deployment
// makes it: by broker.Provisioner, the code of fleet-gw broker-setup,
// through the node's rabbitmqctl; every call gives a new password.
func Provision(vhostURL string, grant func(vhost string) broker.Grant) (string, error) {
	s, err := script()
	if err != nil {
		return "", err
	}
	u, err := neturl.Parse(vhostURL)
	if err != nil {
		return "", err
	}
	u.User = nil
	base, vhost, err := broker.ParseBase(u.String())
	if err != nil {
		return "", err
	}
	g := grant(vhost)
	defer ctlSlot()() // Setup's calls are one after the other
	login, err := broker.Provisioner{Ctl: []string{s, "ctl"}}.Setup(g, base.String())
	if err != nil {
		return "", fmt.Errorf("provisioning the broker login %s: %w", g.User, err)
	}
	return login, nil
}

// The three-node cluster of scripts/rabbitmq-cluster.sh, for the tests of
// a node's loss. make test starts it and passes its nodes' URLs in
// FLEET_TEST_CLUSTER; without that the first test to need it starts it.
var (
	clusterOnce sync.Once
	clusterURLs []string
	clusterErr  error
)

func clusterScript() (string, error) {
	s, err := script()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(s), "rabbitmq-cluster.sh"), nil
}

// Cluster returns the cluster's node URLs (as guest, without a vhost),
// node 1 first.
func Cluster() ([]string, error) {
	clusterOnce.Do(func() {
		raw := os.Getenv("FLEET_TEST_CLUSTER")
		if raw == "" {
			if out, err := ClusterCmd("start"); err != nil {
				clusterErr = fmt.Errorf("starting the private RabbitMQ cluster: %v\n%s", err, out)
				return
			}
			out, err := ClusterCmd("urls")
			if err != nil {
				clusterErr = err
				return
			}
			raw = strings.TrimSpace(string(out))
		}
		for _, u := range broker.SplitURLs(raw) {
			clusterURLs = append(clusterURLs, strings.TrimSuffix(u, "/"))
		}
	})
	return clusterURLs, clusterErr
}

// ClusterLock takes the cluster's test lock (exclusive: the cluster tests
// kill and stop nodes) and returns its release.
func ClusterLock() (func(), error) {
	dir := os.Getenv("FLEET_RMQC_DIR")
	if dir == "" {
		dir = fmt.Sprintf("/tmp/fleet-rmqc-%d", os.Getuid())
	}
	return flock(dir, true)
}

// ClusterCmd runs the cluster script (kill N, start-node N, ctl N ARGS...).
func ClusterCmd(args ...string) ([]byte, error) {
	s, err := clusterScript()
	if err != nil {
		return nil, err
	}
	return exec.Command(s, args...).CombinedOutput()
}

// ClusterLogins makes the vhost on the cluster with each host's own login
// in it, as fleet-gw broker-setup imports them (broker.Definitions: the
// topology with a quorum bridge.dlq, broker.HostGrant, a random password),
// all in one rabbitmqctl call on node 1 where broker-setup makes three per
// host (each starts an Erlang VM: seconds on a loaded machine, and the
// cluster tests start nine). A vhost an earlier run left behind is
// deleted first. It returns each host's broker setting, every node's URI,
// host i (0-based) starting with node i+1, so gateways are spread over the
// nodes; each login is proved by logging in with it. The whole
// broker.Provisioner, with its checks before the import, is run by the
// broker_setup scripts on the single node.
func ClusterLogins(vhost string, hosts ...string) ([]string, error) {
	urls, err := Cluster()
	if err != nil {
		return nil, err
	}
	s, err := clusterScript()
	if err != nil {
		return nil, err
	}
	if vhostMayExist(urls[0] + "/" + neturl.PathEscape(vhost)) {
		ClusterCmd("ctl", "1", "delete_vhost", vhost)
	}
	var all map[string]any
	logins := make([]*neturl.URL, len(hosts))
	for i, host := range hosts {
		var user *neturl.Userinfo
		if all, user, err = addLogin(all, vhost, "quorum", host); err != nil {
			return nil, err
		}
		lu, err := neturl.Parse(urls[0] + "/" + neturl.PathEscape(vhost))
		if err != nil {
			return nil, err
		}
		lu.User = user
		logins[i] = lu
	}
	data, err := json.Marshal(all)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s, "ctl", "1", "import_definitions")
	cmd.Stdin = strings.NewReader(string(data))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("import_definitions on the cluster: %v\n%s", err, out)
	}
	var settings []string
	for i, lu := range logins {
		if err := canOpen(lu.String()); err != nil {
			return nil, fmt.Errorf("the new broker login of %s does not log in: %v", hosts[i], err)
		}
		var out []string
		for k := range urls {
			nu, err := neturl.Parse(urls[(i+k)%len(urls)])
			if err != nil {
				return nil, err
			}
			lu.Host = nu.Host
			out = append(out, lu.String())
		}
		settings = append(settings, strings.Join(out, ","))
	}
	return settings, nil
}
