package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// statsOptions are the flags of `task stats` and `service stats`.
type statsOptions struct {
	format   string
	noStream bool
	interval time.Duration
}

func (o *statsOptions) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "table", "output format: table, json (a document per round while streaming) or template=GO-TEMPLATE (a line a task)")
	cmd.Flags().Var(dockerFormat{&o.format}, "format", "print each task with a Go template, as docker's --format ('{{.Task}} {{.MemoryBytes}}')")
	cmd.Flags().BoolVar(&o.noStream, "no-stream", false, "print one round (two samples an interval apart, for the rates) and exit")
	cmd.Flags().DurationVar(&o.interval, "interval", time.Second, "time between samples (at least 100ms)")
}

func (o *statsOptions) check() error {
	if err := checkStreamFormat(o.format); err != nil {
		return err
	}
	if o.interval < 100*time.Millisecond {
		return usageError{fmt.Errorf("--interval %v: want at least 100ms", o.interval)}
	}
	return nil
}

func (a *app) taskStats() *cobra.Command {
	var o statsOptions
	var node, service string
	cmd := &cobra.Command{
		Use:   "stats [ID...]",
		Short: "Show the CPU, memory, network and disk use of running tasks",
		Long: `Show the resource use of running tasks, as docker stats does: the tasks
named, else every running task of --service or --node, else of the cluster.
Each node samples its own tasks. CPU % is of one CPU (200% is two busy
CPUs), over the last interval; memory leaves out the inactive page cache.
Until interrupted, unless --no-stream. Without IDs, tasks that start
later join the table and tasks that stop leave it; named tasks stay,
with the reason they show no figures.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			return a.runStats(cmd.Context(), &schedv1.TaskStatsRequest{Tasks: args, Service: service, Node: node}, o)
		},
	}
	o.register(cmd)
	cmd.Flags().StringVar(&node, "node", "", "the running tasks of this node (ID or name)")
	cmd.Flags().StringVar(&service, "service", "", "the running tasks of this service")
	return cmd
}

func (a *app) serviceStats() *cobra.Command {
	var o statsOptions
	cmd := &cobra.Command{
		Use:   "stats NAME",
		Short: "Show the CPU, memory, network and disk use of a service's running tasks",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			return a.runStats(cmd.Context(), &schedv1.TaskStatsRequest{Service: args[0]}, o)
		},
	}
	o.register(cmd)
	return cmd
}

// runStats streams samples and prints a round per interval: on a
// terminal in place, else one table (or JSON document) after another.
func (a *app) runStats(ctx context.Context, req *schedv1.TaskStatsRequest, o statsOptions) error {
	c, ctx, closeCall, err := a.scheddStream(ctx)
	if err != nil {
		return err
	}
	defer closeCall()
	req.Interval = durationpb.New(o.interval)
	if o.noStream {
		req.Count = 2
	}
	stream, err := c.TaskStats(ctx, req)
	if err != nil {
		return err
	}
	replies := make(chan *schedv1.TaskStatsReply)
	done := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				done <- err
				return
			}
			select {
			case replies <- r:
			case <-ctx.Done():
				done <- ctx.Err()
				return
			}
		}
	}()
	tracker := newStatsTracker()
	tty := isTerminal(a.out)
	ticker := time.NewTicker(o.interval)
	defer ticker.Stop()
	printed := false
	for {
		select {
		case r := <-replies:
			tracker.add(r)
		case err := <-done:
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if err != nil && ctx.Err() == nil {
				return err
			}
			if err == nil && !o.noStream && req.GetService() != "" {
				// schedd ends a followed stream only when the
				// service is gone.
				fmt.Fprintf(a.errOut, "service %s was removed\n", req.GetService())
			}
			if o.noStream || !printed {
				return a.printStats(tracker.views(), o.format, false, false)
			}
			return nil
		case <-ticker.C:
			if o.noStream || !tracker.fresh {
				continue
			}
			tracker.fresh = false
			if err := a.printStats(tracker.views(), o.format, tty, !tty); err != nil {
				return err
			}
			printed = true
		}
	}
}

// statsView is one task's line: its last sample, with the rates over the
// interval before it.
type statsView struct {
	Task     string    `json:"task"`
	Service  string    `json:"service"`
	Slot     string    `json:"slot"`
	Node     string    `json:"node"`
	Time     time.Time `json:"time,omitzero"`
	CPUNanos uint64    `json:"cpu_nanos"`
	// CPUPercent is of one CPU; absent until the task has two samples.
	CPUPercent       *float64 `json:"cpu_percent,omitempty"`
	MemoryBytes      uint64   `json:"memory_bytes"`
	MemoryLimitBytes uint64   `json:"memory_limit_bytes,omitempty"`
	MemoryPercent    *float64 `json:"memory_percent,omitempty"`
	Pids             uint64   `json:"pids"`
	NetRxBytes       uint64   `json:"net_rx_bytes"`
	NetTxBytes       uint64   `json:"net_tx_bytes"`
	BlockReadBytes   uint64   `json:"block_read_bytes"`
	BlockWriteBytes  uint64   `json:"block_write_bytes"`
	Error            string   `json:"error,omitempty"`
}

// statsTracker keeps each task's last two samples.
type statsTracker struct {
	last, prev map[string]*schedv1.TaskStat
	// fresh: a sample came since the last print.
	fresh bool
}

func newStatsTracker() *statsTracker {
	return &statsTracker{last: map[string]*schedv1.TaskStat{}, prev: map[string]*schedv1.TaskStat{}}
}

func (t *statsTracker) add(r *schedv1.TaskStatsReply) {
	for _, id := range r.GetGone() {
		delete(t.last, id)
		delete(t.prev, id)
		t.fresh = true
	}
	for _, s := range r.GetStats() {
		if old := t.last[s.GetTask()]; old != nil && old.GetError() == "" && s.GetError() == "" {
			t.prev[s.GetTask()] = old
		} else {
			delete(t.prev, s.GetTask())
		}
		t.last[s.GetTask()] = s
		t.fresh = true
	}
}

func (t *statsTracker) views() []statsView {
	out := []statsView{}
	for id, s := range t.last {
		out = append(out, statsViewOf(s, t.prev[id]))
	}
	sort.Slice(out, func(i, j int) bool {
		return taskKey{out[i].Service, out[i].Slot, out[i].Task}.less(taskKey{out[j].Service, out[j].Slot, out[j].Task})
	})
	return out
}

// statsViewOf makes a line of sample s, its CPU rate taken against prev
// (nil: none yet).
func statsViewOf(s, prev *schedv1.TaskStat) statsView {
	v := statsView{Task: s.GetTask(), Service: s.GetService(), Slot: s.GetSlot(), Node: s.GetNode(), Error: s.GetError()}
	if v.Error != "" {
		return v
	}
	v.Time = s.GetTime().AsTime()
	v.CPUNanos, v.MemoryBytes, v.MemoryLimitBytes, v.Pids = s.GetCpuNanos(), s.GetMemoryBytes(), s.GetMemoryLimitBytes(), s.GetPids()
	v.NetRxBytes, v.NetTxBytes = s.GetNetRxBytes(), s.GetNetTxBytes()
	v.BlockReadBytes, v.BlockWriteBytes = s.GetBlockReadBytes(), s.GetBlockWriteBytes()
	if v.MemoryLimitBytes > 0 {
		p := 100 * float64(v.MemoryBytes) / float64(v.MemoryLimitBytes)
		v.MemoryPercent = &p
	}
	if prev != nil {
		wall := s.GetTime().AsTime().Sub(prev.GetTime().AsTime())
		if wall > 0 && s.GetCpuNanos() >= prev.GetCpuNanos() {
			p := 100 * float64(s.GetCpuNanos()-prev.GetCpuNanos()) / float64(wall.Nanoseconds())
			v.CPUPercent = &p
		}
	}
	return v
}

// printStats prints a round; redraw clears a terminal first, as docker
// stats does, so the table stays in place; apart ends a table with a blank
// line, to tell the rounds apart in a stream that is not redrawn.
func (a *app) printStats(views []statsView, format string, redraw, apart bool) error {
	if text, ok := strings.CutPrefix(format, templatePrefix); ok {
		return renderTemplate(a.out, text, views)
	}
	if format == "json" {
		// One document a line, so a stream of rounds is JSON Lines.
		b, err := json.Marshal(views)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.out, "%s\n", b)
		return err
	}
	if redraw {
		fmt.Fprint(a.out, "\033[2J\033[H")
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tSERVICE\tSLOT\tNODE\tCPU %\tMEM USAGE / LIMIT\tMEM %\tNET I/O\tBLOCK I/O\tPIDS")
	for _, v := range views {
		if v.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t--\t-- / --\t--\t--\t--\t--\t(%s)\n", v.Task, v.Service, v.Slot, v.Node, v.Error)
			continue
		}
		limit, memPct, cpu := "-", "-", "--"
		if v.MemoryLimitBytes > 0 {
			limit = bytesText(v.MemoryLimitBytes)
		}
		if v.MemoryPercent != nil {
			memPct = fmt.Sprintf("%.2f%%", *v.MemoryPercent)
		}
		if v.CPUPercent != nil {
			cpu = fmt.Sprintf("%.2f%%", *v.CPUPercent)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s / %s\t%s\t%s / %s\t%s / %s\t%d\n", v.Task, v.Service, v.Slot, v.Node, cpu,
			bytesText(v.MemoryBytes), limit, memPct, bytesText(v.NetRxBytes), bytesText(v.NetTxBytes),
			bytesText(v.BlockReadBytes), bytesText(v.BlockWriteBytes), v.Pids)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if apart {
		fmt.Fprintln(a.out)
	}
	return nil
}
