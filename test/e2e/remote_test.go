package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRemoteCLI: shoalctl --host ssh://… runs a command against another
// node's daemons through a real sshd in that node's network namespace:
// its answers are that node's, a file named on the command line is read
// where shoalctl runs, and a host that does not answer is reported with
// ssh's reason and exit 4.
func TestRemoteCLI(t *testing.T) {
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		sshd = "/usr/sbin/sshd"
	}
	if _, err := os.Stat(sshd); err != nil {
		t.Fatalf("no sshd (make deps installs openssh-server): %v", err)
	}
	c := devCluster(t, 2)
	dir := t.TempDir()
	keygen := func(name string) {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, name)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen %s: %v\n%s", name, err, out)
		}
	}
	keygen("host")
	keygen("client")
	pub, err := os.ReadFile(filepath.Join(dir, "client.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	// sshd wants its privilege separation directory.
	if _, err := os.Stat("/run/sshd"); os.IsNotExist(err) {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove("/run/sshd") })
	}
	addr := c.Addr(1)
	cfg := strings.Join([]string{
		"Port 2222", "ListenAddress " + addr, "HostKey " + filepath.Join(dir, "host"),
		"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"), "PermitRootLogin prohibit-password",
		"PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
		"PidFile none", "LogLevel ERROR",
	}, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd, err := c.Command(ctx, 1, sshd, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	if err != nil {
		t.Fatal(err)
	}
	var sshdLog syncBuffer
	cmd.Stdout, cmd.Stderr = &sshdLog, &sshdLog
	if err := c.StartIn(1, cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("sshd:\n%s", sshdLog.String())
		}
	})
	env := []string{
		"SHOAL_SSH_COMMAND=ssh -i " + filepath.Join(dir, "client") +
			" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=5",
		"SHOAL_REMOTE_CTL=" + bin("shoalctl"),
	}
	host := fmt.Sprintf("ssh://root@%s:2222", addr)
	// From node 2, whose own run dir is in its environment, against node
	// 1's daemons: --run-dir is the run dir there.
	remote := func(args ...string) (string, string, int) {
		t.Helper()
		argv := append([]string{bin("shoalctl"), "--host", host, "--run-dir", c.RunDir(1)}, args...)
		out, errOut, code, err := c.Exec(context.Background(), 2, argv, env)
		if err != nil {
			t.Fatal(err)
		}
		return out, errOut, code
	}
	var rows []struct {
		Name      string `json:"name"`
		Socket    string `json:"socket"`
		Reachable bool   `json:"reachable"`
		PID       int    `json:"pid"`
	}
	waitFor(t, 20*time.Second, "sshd answers", func() bool {
		out, _, code := remote("daemon", "status", "-o", "json")
		return code == 0 && json.Unmarshal([]byte(out), &rows) == nil
	})
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	statdPID := map[int]int{}
	for _, n := range st.Nodes {
		for _, p := range n.Processes {
			if p.Name == "statd" {
				statdPID[n.Node] = p.PID
			}
		}
	}
	if len(rows) == 0 || rows[0].Name != "statd" || !rows[0].Reachable || rows[0].PID != statdPID[1] ||
		rows[0].Socket != host+c.RunDir(1)+"/statd.sock" {
		t.Fatalf("daemon status through %s: %+v; want node 1's statd (pid %d; node 2's is %d)", host, rows, statdPID[1], statdPID[2])
	}
	// A config from a file where shoalctl runs, created through node 1.
	file := filepath.Join(dir, "app.conf")
	if err := os.WriteFile(file, []byte("listen 8080;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := remote("config", "create", "remote-app", file); code != 0 {
		t.Fatalf("config create through %s: exit %d\n%s%s", host, code, out, errOut)
	}
	waitFor(t, 20*time.Second, "the config on node 2", func() bool {
		out, _, code, _ := c.Ctl(context.Background(), 2, "config", "inspect", "remote-app", "-o", "json")
		return code == 0 && strings.Contains(out, "listen 8080;")
	})
	// Nothing listens on 2223: ssh's reason, and exit 4 (unreachable).
	argv := []string{bin("shoalctl"), "--host", fmt.Sprintf("ssh://root@%s:2223", addr), "--timeout", "20s", "config", "ls"}
	out, errOut, code, err := c.Exec(context.Background(), 2, argv, env)
	if err != nil {
		t.Fatal(err)
	}
	if code != 4 || !strings.Contains(errOut, "ssh: ") || !strings.Contains(strings.ToLower(errOut), "refused") {
		t.Fatalf("a host that refuses: exit %d, want 4 with ssh's reason\n%s%s", code, out, errOut)
	}
	if _, errOut, code, _ := c.Exec(context.Background(), 2, []string{bin("shoalctl"), "--host", "http://" + addr, "config", "ls"}, nil); code != 2 {
		t.Fatalf("--host http://: exit %d, want 2\n%s", code, errOut)
	}
}
