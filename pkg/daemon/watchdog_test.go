package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// The watchdog pings only while the daemon's liveness check passes: a
// failing check and one that hangs both stop the pings, and they resume
// once the check passes again.
func TestWatchdogPingsOnlyWhileLive(t *testing.T) {
	const (
		healthy int32 = iota
		failing
		hanging
	)
	var mode atomic.Int32
	events := make(chan string, 1000)
	release := make(chan struct{}) // lets a hanging check return
	live := func(ctx context.Context) error {
		switch mode.Load() {
		case failing:
			events <- "fail"
			return errors.New("store does not answer")
		case hanging:
			events <- "hang"
			<-release // ignores ctx, as a deadlocked daemon would
			return nil
		}
		events <- "check"
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchdog(ctx, 5*time.Millisecond, live, func() { events <- "ping" }, slog.New(slog.NewTextHandler(io.Discard, nil)))

	next := func() string {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("watchdog stalled")
			return ""
		}
	}
	// waitFor reads events until want, and returns what came before it.
	waitFor := func(want string) []string {
		t.Helper()
		var before []string
		for e := next(); e != want; e = next() {
			before = append(before, e)
		}
		return before
	}

	waitFor("check")
	if e := next(); e != "ping" {
		t.Fatalf("after a passing check: %q, want a ping", e)
	}

	mode.Store(failing)
	waitFor("fail")
	for range 5 {
		if e := next(); e != "fail" {
			t.Fatalf("while the check fails: %q, want only failed checks", e)
		}
	}

	// A hanging check is started once and not again while it hangs; no
	// ping meanwhile.
	mode.Store(hanging)
	waitFor("hang")
	time.Sleep(50 * time.Millisecond) // ten intervals
	select {
	case e := <-events:
		t.Fatalf("while the check hangs: %q, want nothing", e)
	default:
	}

	mode.Store(healthy)
	close(release)
	if before := waitFor("ping"); len(before) > 1 || (len(before) == 1 && before[0] != "check") {
		t.Fatalf("after the hang ended: %v before the ping", before)
	}
	waitFor("check")
	if e := next(); e != "ping" {
		t.Fatalf("healthy again: %q after a check, want a ping", e)
	}
}
