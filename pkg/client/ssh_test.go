package client

import (
	"io"
	"os/exec"
	"strings"
	"testing"
)

func TestParseSSH(t *testing.T) {
	for _, tc := range []struct {
		runDir string
		remote bool
		err    string
	}{
		{"/run/shoal", false, ""},
		{"ssh://node1", true, ""},
		{"ssh://root@node1:2222/run/shoal-dev/n1", true, ""},
		{"ssh://", true, "no host name"},
		{"ssh://root:secret@node1", true, "a password in the URL is not supported"},
		{"ssh://node1/?x=1", true, "want ssh://[user@]host[:port][/run/dir]"},
	} {
		_, remote, err := parseSSH(tc.runDir)
		if remote != tc.remote || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("parseSSH(%q) = %v, %v; want %v, %q", tc.runDir, remote, err, tc.remote, tc.err)
		}
	}
}

func TestSSHRunDir(t *testing.T) {
	for _, tc := range []struct{ host, runDir, want, err string }{
		{"ssh://root@node1:2222", "", "ssh://root@node1:2222", ""},
		{"ssh://node1/", "/run/x/../y", "ssh://node1/run/y", ""},
		{"http://node1", "", "", "want ssh://"},
		{"ssh://node1/run", "", "", "the run dir apart"},
		{"ssh://node1", "rel", "", "want the absolute run dir"},
	} {
		got, err := SSHRunDir(tc.host, tc.runDir)
		if got != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("SSHRunDir(%q, %q) = %q, %v; want %q, %q", tc.host, tc.runDir, got, err, tc.want, tc.err)
		}
	}
}

func TestSSHArgs(t *testing.T) {
	t.Setenv(SSHCommandEnv, "ssh -i '/my keys/k' -o BatchMode=yes")
	t.Setenv(RemoteCtlEnv, "/opt/shoal/bin/shoalctl")
	u, _, err := parseSSH("ssh://ops@node1:2222/run/it's")
	if err != nil {
		t.Fatal(err)
	}
	args, err := sshArgs(u, "schedd")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ssh", "-i", "/my keys/k", "-o", "BatchMode=yes", "-l", "ops", "-p", "2222", "--", "node1"}
	if len(args) != len(want)+1 || strings.Join(args[:len(want)], "|") != strings.Join(want, "|") {
		t.Fatalf("sshArgs:\n got %q\nwant %q and the remote command", args, want)
	}
	// The remote shell splits the command into these words.
	out, err := exec.Command("sh", "-c", `for w in `+args[len(want)]+`; do printf '%s|' "$w"; done`).Output()
	if err != nil || string(out) != "/opt/shoal/bin/shoalctl|--run-dir|/run/it's|dial-stdio|schedd|" {
		t.Fatalf("the remote command %q splits into %q (%v)", args[len(want)], out, err)
	}
	t.Setenv(SSHCommandEnv, "ssh -i 'unclosed")
	if _, err := sshArgs(u, "schedd"); err == nil || !strings.Contains(err.Error(), SSHCommandEnv) {
		t.Fatalf("an ssh command that does not parse: %v", err)
	}
	t.Setenv(SSHCommandEnv, "")
	t.Setenv(RemoteCtlEnv, "")
	u, _, _ = parseSSH("ssh://node1")
	if args, _ := sshArgs(u, "statd"); strings.Join(args, " ") != "ssh -- node1 shoalctl dial-stdio statd" {
		t.Fatalf("sshArgs with defaults: %q", args)
	}
	if got := SocketPath("ssh://node1/run/x/", "vold"); got != "ssh://node1/run/x/vold.sock" {
		t.Errorf("SocketPath = %q", got)
	}
}

// TestCommandConn: bytes go through a command's input and output; when
// it ends with a complaint, a read says it rather than a bare EOF.
func TestCommandConn(t *testing.T) {
	c, err := startCommandConn(exec.Command("cat"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	c.Close()
	c, err = startCommandConn(exec.Command("sh", "-c", "echo first >&2; echo 'ssh: connect to host x port 22: Connection refused' >&2; exit 255"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = io.ReadAll(c)
	if err == nil || err.Error() != "ssh: connect to host x port 22: Connection refused" {
		t.Fatalf("read after the command failed: %v", err)
	}
}
