package schedd

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// fakeVold records Unmount calls and fails them while down.
type fakeVold struct {
	volv1.VolumesClient
	mu     sync.Mutex
	down   bool
	reject bool
	users  map[string]bool // volume/user still counted
	calls  int
}

func (f *fakeVold) Unmount(_ context.Context, req *volv1.UnmountRequest, _ ...grpc.CallOption) (*volv1.UnmountResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.reject {
		return nil, status.Error(codes.InvalidArgument, "bad name")
	}
	if f.down {
		return nil, status.Error(codes.Unavailable, "shoal-vold is not reachable")
	}
	delete(f.users, req.GetName()+"/"+req.GetUser())
	return &volv1.UnmountResponse{}, nil
}

func (f *fakeVold) set(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

// TestReleasesRetriedUntilVoldTakesThem: a release made while vold is
// down is kept and retried until vold takes it; a task that mounts again
// drops its pending release; a release vold rejects as invalid is not
// retried forever.
func TestReleasesRetriedUntilVoldTakesThem(t *testing.T) {
	v := &fakeVold{users: map[string]bool{"data/keeper.1": true, "data/writer.2": true}}
	r := &volumeReleases{vold: v, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()

	v.set(true)
	r.release(ctx, volumeUser{volume: "data", task: "keeper.1"})
	r.release(ctx, volumeUser{volume: "data", task: "writer.2"})
	if len(r.pending) != 2 {
		t.Fatalf("pending = %v, want both releases kept", r.pending)
	}
	r.retry(ctx) // vold still down
	if len(r.pending) != 2 || !v.users["data/keeper.1"] {
		t.Fatalf("pending = %v, users %v: nothing should change while vold is down", r.pending, v.users)
	}

	// writer.2 mounts again before vold takes its release: the release
	// must not undo the new mount.
	r.forget(volumeUser{volume: "data", task: "writer.2"})
	v.set(false)
	r.retry(ctx)
	if len(r.pending) != 0 {
		t.Fatalf("pending = %v after vold came back", r.pending)
	}
	if v.users["data/keeper.1"] || !v.users["data/writer.2"] {
		t.Fatalf("vold's users = %v, want keeper.1 released and writer.2 kept", v.users)
	}

	// A direct release with vold up is not kept.
	r.release(ctx, volumeUser{volume: "data", task: "writer.2"})
	if len(r.pending) != 0 || v.users["data/writer.2"] {
		t.Fatalf("pending = %v, users %v", r.pending, v.users)
	}

	// A release vold rejects is dropped, not retried.
	v.reject = true
	r.release(ctx, volumeUser{volume: "Bad", task: "x.1"})
	calls := v.calls
	r.retry(ctx)
	if len(r.pending) != 0 || v.calls != calls {
		t.Fatalf("a rejected release was kept: pending %v, %d calls", r.pending, v.calls-calls)
	}
}

// TestReleasesOutliveARestart: releases vold did not take are saved, and
// the next schedd (a new volumeReleases on the same file) retries them;
// the file empties as vold takes them. Kept in memory only, a restart
// before vold came back left the tasks counted as users for good, and
// `volume rm` refused the volume.
func TestReleasesOutliveARestart(t *testing.T) {
	v := &fakeVold{users: map[string]bool{"data/keeper.1": true, "logs/keeper.1": true}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	path := filepath.Join(t.TempDir(), "volume-releases.json")
	ctx := context.Background()

	first := &volumeReleases{vold: v, log: log, path: path}
	if err := first.load(); err != nil {
		t.Fatalf("load with no file: %v", err)
	}
	v.set(true)
	first.release(ctx, volumeUser{volume: "data", task: "keeper.1"})
	first.release(ctx, volumeUser{volume: "logs", task: "keeper.1"})

	next := &volumeReleases{vold: v, log: log, path: path}
	if err := next.load(); err != nil {
		t.Fatal(err)
	}
	if len(next.pending) != 2 {
		t.Fatalf("the next schedd loaded %v, want both releases", next.pending)
	}
	v.set(false)
	next.retry(ctx)
	if len(v.users) != 0 || len(next.pending) != 0 {
		t.Fatalf("after the retry: vold's users %v, pending %v", v.users, next.pending)
	}
	again := &volumeReleases{vold: v, log: log, path: path}
	if err := again.load(); err != nil || len(again.pending) != 0 {
		t.Fatalf("the file still holds %v (%v) once vold took every release", again.pending, err)
	}

	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (&volumeReleases{vold: v, log: log, path: path}).load(); err == nil {
		t.Fatal("a corrupt file loaded without an error")
	}
}
