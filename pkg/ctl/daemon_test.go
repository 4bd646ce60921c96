package ctl

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestDaemonStatusTellsStuckFromAbsent: a daemon whose socket accepts the
// call but never answers is shown as not answering, one without a socket
// as not reachable, and status returns for both.
func TestDaemonStatusTellsStuckFromAbsent(t *testing.T) {
	dir := t.TempDir()
	lis, err := net.Listen("unix", filepath.Join(dir, "vold.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		// Accept and hold every connection without a word of HTTP/2.
		var held []net.Conn
		for {
			c, err := lis.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	a := &app{runDir: dir}
	rows := a.daemonStatus(context.Background())
	for _, r := range rows {
		if r.Reachable {
			t.Fatalf("%s shown reachable", r.Name)
		}
		want := "not reachable at " + filepath.Join(dir, r.Name+".sock")
		if r.Name == "vold" {
			want = "no answer within 2s at " + filepath.Join(dir, "vold.sock")
		}
		if !strings.Contains(r.Error, want) {
			t.Fatalf("%s: error %q, want %q", r.Name, r.Error, want)
		}
	}
}
