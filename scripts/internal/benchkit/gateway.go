package benchkit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

const (
	maxSocketPath = 107             // sun_path minus the NUL
	stopGrace     = 5 * time.Second // SIGTERM to SIGKILL
)

// GatewayConfig says how to start one fleet-gw run for a benchmark.
type GatewayConfig struct {
	Bin  string // folder holding the fleet-gw binary
	Dir  string // the gateway's folder (created): state/, gw.sock, gw.log; also its working directory
	Host string // FLEET_HOST
	// Env holds further settings (FLEET_BROKER, FLEET_CONFIG, ...), added
	// after FLEET_HOST, FLEET_STATE_DIR, FLEET_SOCKET and XDG_CONFIG_HOME.
	Env []string
	// TrustFile, when set, is the run's trust file, as deployed: the
	// gateway gets FLEET_TRUST_FILE pointing at it, and its key line
	// (fleet-gw key) is appended to it before it starts.
	TrustFile string
	// Pidfile, when set, holds the gateway's pid while it runs (for a
	// wrapper's cleanup).
	Pidfile string
	// Ready bounds the start: the socket answering a hello and, with
	// WaitBroker, "broker connected" in its log.
	Ready      time.Duration
	WaitBroker bool
}

// Gateway is a fleet-gw run process started by StartGateway. It is
// stopped at Cleanup (SIGTERM, then SIGKILL), or earlier by Stop; the
// kernel kills it if this process dies first.
type Gateway struct {
	Host    string
	Dir     string
	State   string   // FLEET_STATE_DIR
	Socket  string   // FLEET_SOCKET
	Log     string   // its stdout and stderr
	Env     []string // its environment, also for exec'd clients
	Version string   // fleet-gw's, from its hello
	pidfile string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// BaseEnv is the environment minus anything that would point a fleet
// command at another gateway or config file.
func BaseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FLEET_") || k == "XDG_CONFIG_HOME" || k == "XDG_RUNTIME_DIR" || k == "XDG_STATE_HOME" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// StartGateway starts fleet-gw run as cfg says and waits until it is ready.
func StartGateway(cfg GatewayConfig) (*Gateway, error) {
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	g := &Gateway{
		Host:    cfg.Host,
		Dir:     cfg.Dir,
		State:   filepath.Join(cfg.Dir, "state"),
		Socket:  filepath.Join(cfg.Dir, "gw.sock"),
		Log:     filepath.Join(cfg.Dir, "gw.log"),
		pidfile: cfg.Pidfile,
		exited:  make(chan struct{}),
	}
	if len(g.Socket) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is too long for a unix socket; use a shorter -dir", g.Socket)
	}
	g.Env = append(BaseEnv(),
		"FLEET_HOST="+cfg.Host,
		"FLEET_STATE_DIR="+g.State,
		"FLEET_SOCKET="+g.Socket,
		"XDG_CONFIG_HOME="+filepath.Join(cfg.Dir, "no-config"), // no user config file
	)
	g.Env = append(g.Env, cfg.Env...)
	gw := filepath.Join(cfg.Bin, "fleet-gw")
	if cfg.TrustFile != "" {
		g.Env = append(g.Env, "FLEET_TRUST_FILE="+cfg.TrustFile)
		if err := g.trust(gw, cfg.TrustFile); err != nil {
			return nil, err
		}
	}
	logf, err := os.OpenFile(g.Log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	g.cmd = exec.Command(gw, "run")
	g.cmd.Env = g.Env
	g.cmd.Dir = cfg.Dir
	g.cmd.Stdout = logf
	g.cmd.Stderr = logf
	// If this process dies without cleaning up, the kernel kills the gateway.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() {
		_ = g.cmd.Wait()
		logf.Close()
		close(g.exited)
	}()
	AtCleanup(g.Stop)
	if g.pidfile != "" {
		if err := os.WriteFile(g.pidfile, []byte(strconv.Itoa(g.cmd.Process.Pid)+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	if err := g.waitReady(cfg.Ready, cfg.WaitBroker); err != nil {
		return nil, err
	}
	return g, nil
}

// trust appends the gateway's key line (fleet-gw key, which makes its
// host key) to the trust file.
func (g *Gateway) trust(gw, trustFile string) error {
	key := exec.Command(gw, "key")
	key.Env = g.Env
	line, err := key.Output()
	if err != nil {
		return fmt.Errorf("fleet-gw key for %s: %w", g.Host, err)
	}
	tf, err := os.OpenFile(trustFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = tf.Write(line)
	if cerr := tf.Close(); err == nil {
		err = cerr
	}
	return err
}

// waitReady waits for the socket to answer a hello and, with broker, for
// "broker connected" in the log, all within d.
func (g *Gateway) waitReady(d time.Duration, broker bool) error {
	deadline := time.Now().Add(d)
	for {
		c, err := api.Dial(g.Socket)
		if err == nil {
			g.Version = c.Hello.Version
			c.Close()
			break
		}
		if err := g.Alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fleet-gw %s not ready after %v: %v; its log:\n%s", g.Host, d, err, Tail(g.Log))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !broker {
		return nil
	}
	for !strings.Contains(ReadFile(g.Log), "broker connected") {
		if err := g.Alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fleet-gw %s: no broker connection after %v; its log:\n%s", g.Host, d, Tail(g.Log))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// Pid is the gateway's process id.
func (g *Gateway) Pid() int { return g.cmd.Process.Pid }

// Stop sends SIGTERM, waits for the drain, then SIGKILLs, and removes the
// pid file. Idempotent.
func (g *Gateway) Stop() {
	select {
	case <-g.exited:
	default:
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.exited:
		case <-time.After(stopGrace):
			_ = g.cmd.Process.Kill()
			<-g.exited
		}
	}
	if g.pidfile != "" {
		_ = os.Remove(g.pidfile)
	}
}

// StopGateways stops gateways in parallel.
func StopGateways(gws []*Gateway) {
	var wg sync.WaitGroup
	for _, g := range gws {
		wg.Add(1)
		go func() { defer wg.Done(); g.Stop() }()
	}
	wg.Wait()
}

// Alive returns an error, with the end of its log, once the gateway has
// exited.
func (g *Gateway) Alive() error {
	select {
	case <-g.exited:
		return fmt.Errorf("fleet-gw %s exited; its log:\n%s", g.Host, Tail(g.Log))
	default:
		return nil
	}
}

// Memory reads the gateway's memory.
func (g *Gateway) Memory() (Memory, error) { return ReadMemory(g.Pid()) }

// CPU returns the gateway's user+system CPU time so far (/proc/PID/stat).
func (g *Gateway) CPU() time.Duration { return ProcCPU(g.Pid()) }

// Dial opens a client connection to the gateway, as token ("" for none).
func (g *Gateway) Dial(token string) (*api.Client, error) {
	c, err := api.Dial(g.Socket)
	if err != nil {
		return nil, err
	}
	c.Token = token
	return c, nil
}

// Join registers name as a pull entity through c and returns its
// credential.
func Join(c *api.Client, name string) (string, error) {
	resp, err := c.Call(&api.JoinRequest{Name: name, Mode: "pull"})
	if err != nil {
		return "", fmt.Errorf("join %s: %w", name, err)
	}
	if resp.Token == "" {
		return "", fmt.Errorf("join %s: no credential in the reply", name)
	}
	return resp.Token, nil
}

// JoinMany registers names on g as pull entities over `conns` connections
// and returns their credentials, in the order of names.
func JoinMany(g *Gateway, names []string, conns int) ([]string, error) {
	toks := make([]string, len(names))
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl, err := g.Dial("")
			if err != nil {
				errs[c] = err
				return
			}
			defer cl.Close()
			for i := c; i < len(names); i += conns {
				if toks[i], err = Join(cl, names[i]); err != nil {
					errs[c] = err
					return
				}
			}
		}(c)
	}
	wg.Wait()
	return toks, errors.Join(errs...)
}
