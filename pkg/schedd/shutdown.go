package schedd

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
)

// Bounds of stopForShutdown, within the 30 s after which systemd kills
// schedd (TimeoutStopSec): the tasks' stops, then the wait for statd to
// pass the news on.
// A start-first service's task first waits for its replacement, within
// the stop limit.
const (
	shutdownStopLimit     = 22 * time.Second
	shutdownSyncLimit     = 3 * time.Second
	shutdownHandOverLimit = 5 * time.Second
)

// stopForShutdown hands this node's tasks over to the cluster when the
// machine shuts down (schedd's loop has ended by then, so none is
// restarted here):
//
//   - It first writes into its node document that the node shut down.
//     Every other node's scheduler leaves it out at once (sched.Up), where
//     membership would count it alive until its statd stops and dead only
//     after the failure detector's timeout: the services it owned get
//     another owner, nothing new is placed on it, and its tasks are
//     replaced elsewhere.
//   - It stops every running task, each with its service's stop grace,
//     and records it stopped (sched.StoppedForShutDown): a terminal
//     state, so that the task is not started again here after a reboot,
//     and its owner replaces it at once. A task whose stop failed is
//     left to membership, as after any node that goes down.
//   - A task of a start-first service (its update order) is stopped only
//     once its replacement runs on another node, healthy if checked
//     (sched.ReplacementRuns), or after shutdownHandOverLimit: the owner
//     places the replacement as soon as it reads the node's word, so the
//     service has no gap. A stop-first service's task stops at once, as
//     its updates do.
//   - It waits (shortly) until statd has completed a sync with a peer
//     since, so that the writes have left the machine before statd stops.
//
// A restart of schedd leaves its tasks running, and so would a shutdown:
// the tasks would then get systemd's last SIGTERM and SIGKILL after every
// unit had stopped, their volumes' vold and their network's netd gone and
// their root file systems unmounted. schedd's unit is ordered after
// vold's, netd's, statd's and containerd's, so at shutdown it stops first,
// and all of those still serve it and the tasks meanwhile. The next start
// clears the node document's word (publishNode).
func (n *node) stopForShutdown() {
	if n.nodeID() == "" {
		return // never found its cluster, so it adopted no task either
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownStopLimit+shutdownSyncLimit)
	defer cancel()
	if err := n.put(ctx, sched.NodeKey(n.id), sched.ShutDownFields(true)); err != nil {
		n.log.Warn("tell the cluster this node shuts down", "err", err)
	}
	type stop struct {
		task       sched.Task
		rt         sched.Runtime
		grace      time.Duration
		startFirst bool
	}
	var stops []stop
	var longest time.Duration
	n.amu.Lock()
	for _, lt := range n.local {
		if lt.Runtime.State == sched.RuntimeRunning || lt.Runtime.State == sched.RuntimeStarting {
			grace := cmp.Or(lt.Spec.StopGrace.D(), sched.DefaultStopGrace)
			startFirst := lt.Spec.Update.Order == sched.StartFirst && !lt.Spec.Global
			stops = append(stops, stop{lt.Task, lt.Runtime, grace, startFirst})
			if startFirst {
				grace += shutdownHandOverLimit
			}
			longest = max(longest, grace)
		}
	}
	n.amu.Unlock()
	if len(stops) > 0 {
		n.log.Info("the system is shutting down: stopping this node's tasks and handing them over", "tasks", len(stops))
		sctx, scancel := context.WithTimeout(ctx, min(longest+5*time.Second, shutdownStopLimit))
		var wg sync.WaitGroup
		for _, s := range stops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if s.startFirst {
					n.awaitReplacement(sctx, s.task)
				}
				exit, err := n.rt.Stop(sctx, s.task.ID, s.grace)
				if err != nil {
					n.log.Warn("stop task for the system's shutdown", "task", s.task.ID, "err", err)
					return
				}
				n.log.Info("task stopped for the system's shutdown", "task", s.task.ID, "exit_code", exit.Code)
				rt := s.rt
				rt.State, rt.ExitCode, rt.ExitedAt = sched.RuntimeExited, exit.Code, exit.ExitedAt
				n.amu.Lock()
				if lt := n.local[s.task.ID]; lt != nil {
					lt.Runtime = rt
				}
				n.amu.Unlock()
				n.execAgent(ctx, sched.StoppedForShutDown(s.task, rt, time.Now()))
			}()
		}
		wg.Wait()
		scancel()
	}
	// Pushed to peers as they were written; a round of anti-entropy
	// that began after them makes sure.
	n.waitSyncedSince(ctx, time.Now(), shutdownSyncLimit)
}

// awaitReplacement waits, for shutdownHandOverLimit at most, until task
// t's replacement runs on another node (sched.ReplacementRuns), reading
// statd itself: the mirror stopped with schedd's loop.
func (n *node) awaitReplacement(ctx context.Context, t sched.Task) {
	ctx, cancel := context.WithTimeout(ctx, shutdownHandOverLimit)
	defer cancel()
	for {
		if next, ok := n.replacement(ctx, t); ok {
			n.log.Info("start-first task's replacement runs: stopping it", "task", t.ID, "replacement", next.ID, "node", next.Node)
			return
		}
		select {
		case <-ctx.Done():
			n.log.Warn("start-first task's replacement does not run yet: stopping it all the same", "task", t.ID, "waited", shutdownHandOverLimit)
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// replacement returns the task t's slot names now, if it runs elsewhere.
func (n *node) replacement(ctx context.Context, t sched.Task) (sched.Task, bool) {
	sd, err := n.getMeta(ctx, sched.SlotDocKey(t.Service, t.Slot))
	if err != nil {
		return sched.Task{}, false
	}
	slot, ok := sched.SlotFromDoc(t.Service, t.Slot, statepb.FromDocument(sd))
	if !ok || slot.Task == "" || slot.Task == t.ID {
		return sched.Task{}, false
	}
	td, err := n.getMeta(ctx, sched.TaskKey(slot.Task))
	if err != nil {
		return sched.Task{}, false
	}
	next, _ := sched.TaskFromDoc(slot.Task, statepb.FromDocument(td))
	return next, sched.ReplacementRuns(t, slot, next)
}

// waitSyncedSince waits, for limit at most, until statd has completed an
// anti-entropy round with a peer after since, which then had what this
// node wrote before since (unless the round began before since; statd
// pushes every write to peers at once as well). Alone in the cluster, it
// returns at once; with only dead peers, after limit.
func (n *node) waitSyncedSince(ctx context.Context, since time.Time, limit time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		st, err := n.statd.Cluster.Status(ctx, &clusterv1.StatusRequest{})
		if err == nil {
			peer, others := syncedSince(st, since)
			if !others {
				return
			}
			if peer != "" {
				n.log.Info("the cluster has this node's shutdown", "peer", peer)
				return
			}
		}
		select {
		case <-ctx.Done():
			n.log.Warn("statd has not synced with a peer since the tasks were handed over; they reached the cluster by push, or it learns of the shutdown from membership")
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// shutDown reports whether a node's document says its machine shut down
// (sched.Up).
func (n *node) shutDown(id string) bool {
	d := n.mirror.Get(sched.NodeKey(id))
	return d != nil && sched.NodeFromDoc(id, statepb.FromDocument(d), false).ShutDown
}
