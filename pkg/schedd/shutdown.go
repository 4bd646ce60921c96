package schedd

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
)

// shutdownStopLimit bounds the stops of stopForShutdown: systemd kills
// schedd TimeoutStopSec (30 s) after it asked it to stop.
const shutdownStopLimit = 25 * time.Second

// stopForShutdown stops every task running on this node, each with its
// service's stop grace, when the machine shuts down (schedd's loop has
// ended by then, so none is restarted).
//
// A restart of schedd leaves its tasks running, and so would a shutdown:
// the tasks would then get systemd's last SIGTERM and SIGKILL after every
// unit had stopped, their volumes' vold and their network's netd gone and
// their root file systems unmounted. schedd's unit is ordered after
// vold's, netd's and containerd's, so at shutdown it stops first, and
// the tasks stop while all of those still serve them. Nothing is written
// to the cluster: the node's tasks are replaced elsewhere as after any
// node that goes down.
func (n *node) stopForShutdown() {
	type stop struct {
		id    string
		grace time.Duration
	}
	var stops []stop
	var longest time.Duration
	n.amu.Lock()
	for id, lt := range n.local {
		if lt.Runtime.State == sched.RuntimeRunning || lt.Runtime.State == sched.RuntimeStarting {
			grace := cmp.Or(lt.Spec.StopGrace.D(), sched.DefaultStopGrace)
			stops = append(stops, stop{id, grace})
			longest = max(longest, grace)
		}
	}
	n.amu.Unlock()
	if len(stops) == 0 {
		return
	}
	n.log.Info("the system is shutting down: stopping this node's tasks", "tasks", len(stops))
	ctx, cancel := context.WithTimeout(context.Background(), min(longest+5*time.Second, shutdownStopLimit))
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range stops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exit, err := n.rt.Stop(ctx, s.id, s.grace)
			if err != nil {
				n.log.Warn("stop task for the system's shutdown", "task", s.id, "err", err)
				return
			}
			n.log.Info("task stopped for the system's shutdown", "task", s.id, "exit_code", exit.Code)
		}()
	}
	wg.Wait()
}
