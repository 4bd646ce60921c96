package schedd

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/testimage"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// TestLocalStats samples a running task, a task that stopped and one
// this node does not run, round by round.
func TestLocalStats(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rt := shoalrt.NewFake()
	archive, _, err := testimage.OCI(testimage.Default())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Import(ctx, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	n := &node{id: "n1", rt: rt, local: map[string]*localTask{}}
	for _, id := range []string{"up", "down"} {
		if err := rt.Run(ctx, shoalrt.TaskSpec{ID: id, Image: "local/busybox:latest", Args: []string{"sleep", "inf"}, MemoryBytes: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		n.local[id] = &localTask{LocalTask: sched.LocalTask{Task: sched.Task{ID: id, Service: "web", Slot: id + "-slot"},
			Runtime: sched.Runtime{State: sched.RuntimeRunning}}}
	}
	n.local["down"].Runtime.State = sched.RuntimeExited

	var rounds []*schedv1.TaskStatsReply
	err = n.localStats(ctx, []string{"up", "down", "elsewhere"}, 100*time.Millisecond, 3, func(r *schedv1.TaskStatsReply) error {
		rounds = append(rounds, r)
		return nil
	})
	if err != nil || len(rounds) != 3 {
		t.Fatalf("%d rounds, %v; want 3", len(rounds), err)
	}
	var cpu uint64
	for i, r := range rounds {
		if len(r.GetStats()) != 3 {
			t.Fatalf("round %d: %v", i, r)
		}
		up, down, gone := r.GetStats()[0], r.GetStats()[1], r.GetStats()[2]
		if up.GetError() != "" || up.GetService() != "web" || up.GetSlot() != "up-slot" || up.GetNode() != "n1" ||
			up.GetMemoryLimitBytes() != 1<<20 || up.GetPids() != 1 || up.GetCpuNanos() < cpu {
			t.Errorf("round %d: running task %v", i, up)
		}
		cpu = up.GetCpuNanos()
		if !strings.Contains(down.GetError(), "not running") || down.GetCpuNanos() != 0 {
			t.Errorf("round %d: stopped task %v", i, down)
		}
		if !strings.Contains(gone.GetError(), "does not run on this node") {
			t.Errorf("round %d: unknown task %v", i, gone)
		}
	}
	if d := rounds[2].GetStats()[0].GetTime().AsTime().Sub(rounds[0].GetStats()[0].GetTime().AsTime()); d < 200*time.Millisecond {
		t.Errorf("three rounds 100ms apart took %v", d)
	}

	// Without an interval: one round. A runtime that fails says so in
	// the task's sample.
	rounds = nil
	rt.SetUnavailable(true)
	n.localStats(ctx, []string{"up"}, 0, 0, func(r *schedv1.TaskStatsReply) error { rounds = append(rounds, r); return nil })
	if len(rounds) != 1 || rounds[0].GetStats()[0].GetError() == "" {
		t.Errorf("one round with the runtime down: %v", rounds)
	}
}
