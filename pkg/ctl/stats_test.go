package ctl

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// TaskStats answers count rounds (one without an interval) for two tasks
// of two nodes: web.1 used half a CPU over each second and has a 64 MiB
// limit, web.2 stopped after the first round.
func (f *fakeSchedd) TaskStats(req *schedv1.TaskStatsRequest, stream schedv1.Scheduler_TaskStatsServer) error {
	f.mu.Lock()
	f.statsReqs = append(f.statsReqs, req)
	f.mu.Unlock()
	rounds := int(req.GetCount())
	if req.GetInterval() == nil {
		rounds = 1
	}
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for i := range rounds {
		at := timestamppb.New(start.Add(time.Duration(i) * time.Second))
		one := &schedv1.TaskStat{Task: "aaa1", Service: "web", Slot: "1", Node: "n1", Time: at,
			CpuNanos: uint64(i) * 5e8, MemoryBytes: 16 << 20, MemoryLimitBytes: 64 << 20, Pids: 3,
			NetRxBytes: 2048, NetTxBytes: 1024, BlockWriteBytes: 8 << 20}
		two := &schedv1.TaskStat{Task: "bbb2", Service: "web", Slot: "2", Node: "n2", Time: at, CpuNanos: 7, MemoryBytes: 1 << 20, Pids: 1}
		if i > 0 {
			two = &schedv1.TaskStat{Task: "bbb2", Service: "web", Slot: "2", Node: "n2", Time: at, Error: "task is not running"}
		}
		if err := stream.Send(&schedv1.TaskStatsReply{Stats: []*schedv1.TaskStat{one}}); err != nil {
			return err
		}
		if err := stream.Send(&schedv1.TaskStatsReply{Stats: []*schedv1.TaskStat{two}}); err != nil {
			return err
		}
	}
	return nil
}

func TestServiceStatsNoStream(t *testing.T) {
	dir, fake := startFakeSchedd(t)
	out, errOut, code := ctlRun(t, "--run-dir", dir, "service", "stats", "web", "--no-stream", "--interval", "250ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	req := fake.statsReqs[0]
	if req.GetService() != "web" || req.GetCount() != 2 || req.GetInterval().AsDuration() != 250*time.Millisecond {
		t.Errorf("request %v; want service web, two samples 250ms apart", req)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TASK") {
		t.Fatalf("want a header and a line a task:\n%s", out)
	}
	for _, want := range []string{"aaa1", "50.00%", "16MiB / 64MiB", "25.00%", "2KiB / 1KiB", "0B / 8MiB"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("web.1's line lacks %q: %s", want, lines[1])
		}
	}
	if !strings.Contains(lines[2], "bbb2") || !strings.Contains(lines[2], "task is not running") {
		t.Errorf("web.2's line should say it stopped: %s", lines[2])
	}
}

func TestTaskStatsJSON(t *testing.T) {
	dir, fake := startFakeSchedd(t)
	out, errOut, code := ctlRun(t, "--run-dir", dir, "task", "stats", "aaa", "bbb", "--no-stream", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if req := fake.statsReqs[0]; strings.Join(req.GetTasks(), ",") != "aaa,bbb" || req.GetInterval().AsDuration() != time.Second {
		t.Errorf("request %v; want the two tasks, a second apart", req)
	}
	var views []statsView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(views) != 2 || views[0].CPUPercent == nil || *views[0].CPUPercent != 50 || views[0].MemoryPercent == nil || *views[0].MemoryPercent != 25 {
		t.Fatalf("views %+v", views)
	}
	if views[1].Error == "" || views[1].CPUPercent != nil {
		t.Errorf("the stopped task: %+v; want its error and no rate", views[1])
	}
}

func TestStatsBadFlags(t *testing.T) {
	dir, fake := startFakeSchedd(t)
	for _, args := range [][]string{{"--interval", "10ms"}, {"-o", "yaml"}} {
		_, errOut, code := ctlRun(t, append([]string{"--run-dir", dir, "task", "stats"}, args...)...)
		if code != 2 || !strings.Contains(errOut, strings.TrimLeft(args[0], "-")) {
			t.Errorf("%v: exit %d, %q; want a usage error naming the flag", args, code, errOut)
		}
	}
	if len(fake.statsReqs) != 0 {
		t.Errorf("bad flags still asked schedd: %v", fake.statsReqs)
	}
}

// TestStatsViewRates: the CPU rate is over the two samples' times, and a
// counter that went back (not expected of one task) gives no rate.
func TestStatsViewRates(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	prev := &schedv1.TaskStat{Task: "t", Time: timestamppb.New(at), CpuNanos: 1e9}
	cur := &schedv1.TaskStat{Task: "t", Time: timestamppb.New(at.Add(500 * time.Millisecond)), CpuNanos: 2e9}
	if v := statsViewOf(cur, prev); v.CPUPercent == nil || *v.CPUPercent != 200 {
		t.Errorf("two CPUs busy for 500ms: %+v", v)
	}
	if v := statsViewOf(prev, cur); v.CPUPercent != nil {
		t.Errorf("a counter that went back gave %v%%", *v.CPUPercent)
	}
	if v := statsViewOf(cur, nil); v.CPUPercent != nil || v.MemoryPercent != nil {
		t.Errorf("one sample without a limit: %+v", v)
	}
}

// TestTopLevelStats: `shoalctl stats` is `task stats`, as `docker stats`.
func TestTopLevelStats(t *testing.T) {
	dir, fake := startFakeSchedd(t)
	out, errOut, code := ctlRun(t, "--run-dir", dir, "stats", "aaa", "--no-stream", "--format", "{{.Task}}")
	if code != 0 || out != "aaa1\nbbb2\n" || strings.Join(fake.statsReqs[len(fake.statsReqs)-1].GetTasks(), ",") != "aaa" {
		t.Errorf("stats: exit %d, %q, %s", code, out, errOut)
	}
}

// TestStatsTrackerGone: a task a following stream names as gone leaves
// the table at once, and comes back, rates anew, if it is sampled again.
func TestStatsTrackerGone(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	sample := func(id string, d time.Duration) *schedv1.TaskStat {
		return &schedv1.TaskStat{Task: id, Time: timestamppb.New(at.Add(d)), CpuNanos: uint64(d)}
	}
	tr := newStatsTracker()
	tr.add(&schedv1.TaskStatsReply{Stats: []*schedv1.TaskStat{sample("a", 0), sample("b", 0)}})
	tr.add(&schedv1.TaskStatsReply{Stats: []*schedv1.TaskStat{sample("a", time.Second), sample("b", time.Second)}})
	tr.fresh = false
	tr.add(&schedv1.TaskStatsReply{Gone: []string{"a"}})
	if v := tr.views(); !tr.fresh || len(v) != 1 || v[0].Task != "b" || v[0].CPUPercent == nil {
		t.Fatalf("after a gone: fresh %v, %+v", tr.fresh, v)
	}
	tr.add(&schedv1.TaskStatsReply{Stats: []*schedv1.TaskStat{sample("a", 2*time.Second)}})
	for _, v := range tr.views() {
		if v.Task == "a" && v.CPUPercent != nil {
			t.Errorf("a task back after gone has a rate from before: %+v", v)
		}
	}
	if len(tr.views()) != 2 {
		t.Errorf("views %+v, want a and b", tr.views())
	}
}
