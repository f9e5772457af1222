// Package testnode is the tests' way to the private RabbitMQ node of
// scripts/rabbitmq-node.sh: its URL (FLEET_TEST_BROKER, or the node started
// on first use), rabbitmqctl, a vhost of a test's own, and the node's test
// lock. Tests of several packages run as several processes at once, and
// the outage scripts stop and block the node: they take the lock
// exclusively, every other broker test shares it. Only tests import it.
package testnode

import (
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/fleetd/fleet/pkg/broker"
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
	return exec.Command(s, args...).CombinedOutput()
}

// Ctl runs rabbitmqctl on the node.
func Ctl(args ...string) ([]byte, error) { return Node(append([]string{"ctl"}, args...)...) }

// Vhost makes a fresh vhost name for guest and returns its URL and its
// removal.
func Vhost(name string) (string, func(), error) {
	base, err := URL()
	if err != nil {
		return "", nil, err
	}
	Ctl("delete_vhost", name)
	if out, err := Ctl("add_vhost", name); err != nil {
		return "", nil, fmt.Errorf("add_vhost: %v\n%s", err, out)
	}
	if out, err := Ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*"); err != nil {
		return "", nil, fmt.Errorf("set_permissions: %v\n%s", err, out)
	}
	u := base + "/" + name
	return u, func() {
		Ctl("delete_vhost", name) // its permissions go with it: so do the logins made in it
		loginsMu.Lock()
		for k := range logins {
			if strings.HasPrefix(k, u+" ") {
				delete(logins, k)
			}
		}
		loginsMu.Unlock()
	}, nil
}

// Lock takes the node's test lock, shared or exclusive, and returns its
// release. It is a file lock, so tests in other processes respect it.
func Lock(exclusive bool) (func(), error) {
	dir := os.Getenv("FLEET_RMQ_DIR")
	if dir == "" {
		dir = fmt.Sprintf("/tmp/fleet-rmq-%d", os.Getuid())
	}
	return flock(dir, exclusive)
}

// flock takes dir/tests.lock, shared or exclusive, and returns its release.
func flock(dir string, exclusive bool) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "tests.lock"), os.O_CREATE|os.O_RDWR, 0o600)
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
	loginsMu.Lock()
	defer loginsMu.Unlock()
	key := vhostURL + " " + host
	if u, ok := logins[key]; ok {
		return u, nil
	}
	u, err := Provision(vhostURL, func(vhost string) broker.Grant { return broker.HostGrant(vhost, host) })
	if err != nil {
		return "", err
	}
	logins[key] = u
	return u, nil
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

// ClusterLogin makes host's own login in vhost on the cluster (as
// fleet-gw broker-setup does, through node 1's rabbitmqctl, with a quorum
// bridge.dlq) and returns its broker setting: every node's URI, starting
// with node first (1-based), so gateways can be spread over the nodes.
func ClusterLogin(vhost, host string, first int) (string, error) {
	urls, err := Cluster()
	if err != nil {
		return "", err
	}
	s, err := clusterScript()
	if err != nil {
		return "", err
	}
	base := urls[0] + "/" + neturl.PathEscape(vhost)
	u, err := neturl.Parse(base)
	if err != nil {
		return "", err
	}
	u.User = nil
	login, err := broker.Provisioner{Ctl: []string{s, "ctl", "1"}, QueueType: "quorum"}.Setup(broker.HostGrant(vhost, host), u.String())
	if err != nil {
		return "", err
	}
	lu, err := neturl.Parse(login)
	if err != nil {
		return "", err
	}
	var out []string
	for i := range urls {
		nu, err := neturl.Parse(urls[(first-1+i)%len(urls)])
		if err != nil {
			return "", err
		}
		lu.Host = nu.Host
		out = append(out, lu.String())
	}
	return strings.Join(out, ","), nil
}
