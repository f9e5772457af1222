package benchkit

// node.go — the private RabbitMQ node, through its script
// (scripts/rabbitmq-node.sh): one bounded call, and a run's own vhost.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Node is the private node's script: Script its path, Prog the program
// named in errors, Piddir where the vhost's marker goes for a wrapper's
// cleanup ("": none).
type Node struct {
	Script string
	Prog   string
	Piddir string
}

// ctlTimeout bounds one call of the script (one rabbitmqctl).
const ctlTimeout = 90 * time.Second

// Run runs the node script with args, bounded; its whole process group
// is killed on timeout or when we die.
func (n Node) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Script, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second // a daemon (epmd) keeping our pipe open
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %v: %s", n.Script, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// CreateVhost creates the run's vhost (refusing one that exists: it may
// be someone else's), gives guest every permission in it, and registers
// its deletion at Cleanup.
func (n Node) CreateVhost(name string) error {
	out, err := n.Run("ctl", "list_vhosts", "name")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == name {
			return fmt.Errorf("vhost %q exists already (left by an earlier run, or someone else's): delete it with %s ctl delete_vhost %s, or pass another -vhost",
				name, n.Script, name)
		}
	}
	if _, err := n.Run("ctl", "add_vhost", name); err != nil {
		return err
	}
	marker := ""
	if n.Piddir != "" {
		marker = filepath.Join(n.Piddir, "vhost")
		_ = os.WriteFile(marker, []byte(name+"\n"), 0o600)
	}
	AtCleanup(func() {
		if _, err := n.Run("ctl", "delete_vhost", name); err != nil {
			fmt.Fprintf(os.Stderr, "%s: deleting vhost %s: %v\n", n.Prog, name, err)
			return // the wrapper tries again from the marker
		}
		if marker != "" {
			_ = os.Remove(marker)
		}
	})
	_, err = n.Run("ctl", "set_permissions", "-p", name, "guest", ".*", ".*", ".*")
	return err
}
