package sched

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
)

// docWorld applies field writes to documents as statd merges them, and
// records the events each write makes.
type docWorld struct {
	t    *testing.T
	docs map[string]crdt.Doc
	tick int64
	out  []string
}

func (w *docWorld) stamp() crdt.Stamp {
	w.tick++
	return crdt.Stamp{TS: hlc.Timestamp{Wall: w.tick}, Node: "n"}
}

// write merges fields into key's document and logs its events.
func (w *docWorld) write(key string, fields map[string]crdt.Value) {
	before := w.docs[key]
	after := crdt.Doc{Fields: maps.Clone(before.Fields), Deleted: before.Deleted}
	if after.Fields == nil {
		after.Fields = map[string]crdt.Field{}
	}
	s := w.stamp()
	for k, v := range fields {
		after.Fields[k] = crdt.Field{Value: v, Stamp: s}
	}
	w.docs[key] = after
	w.log(key, before, after)
}

func (w *docWorld) remove(key string) {
	before := w.docs[key]
	after := crdt.Doc{Deleted: w.stamp()}
	w.docs[key] = after
	w.log(key, before, after)
}

func (w *docWorld) log(key string, before, after crdt.Doc) {
	for _, e := range DocEvents(key, before, after, time.Unix(0, w.tick)) {
		var attrs []string
		for _, k := range slices.Sorted(maps.Keys(e.Attributes)) {
			attrs = append(attrs, k+"="+e.Attributes[k])
		}
		w.out = append(w.out, fmt.Sprintf("%s %s %s (%s)", e.Type, e.Action, e.ID, strings.Join(attrs, ", ")))
	}
}

func (w *docWorld) expect(want ...string) {
	w.t.Helper()
	if !slices.Equal(w.out, want) {
		w.t.Errorf("events:\n  %s\nwant:\n  %s", strings.Join(w.out, "\n  "), strings.Join(want, "\n  "))
	}
	w.out = nil
}

func TestDocEvents(t *testing.T) {
	w := &docWorld{t: t, docs: map[string]crdt.Doc{}}
	spec := ServiceSpec{Name: "web", Image: "local/busybox:latest", Replicas: 2}
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

	// A service's life: create, converge, update, pause, rollback, remove.
	w.write(ServiceKey("web"), ServiceFields(Service{Name: "web", Spec: spec, Version: 1, Updated: at}))
	w.expect("service create web (image=local/busybox:latest, replicas=2, version=1)")
	w.write(ServiceKey("web"), SetServiceState{Service: "web", State: ServiceActive, Converged: 1}.Fields(at))
	w.expect("service converge web (image=local/busybox:latest, replicas=2, version=1)")
	w.write(ServiceKey("web"), SetServiceState{Service: "web", State: ServiceActive, Converged: 1}.Fields(at))
	w.expect() // the owner writing the same again
	v2 := spec
	v2.Replicas = 3
	w.write(ServiceKey("web"), ServiceFields(Service{Name: "web", Spec: v2, PrevSpec: &spec, Version: 2, Updated: at}))
	w.expect("service update web (image=local/busybox:latest, replicas=3, version=2)")
	w.write(ServiceKey("web"), SetServiceState{Service: "web", State: ServicePaused}.Fields(at))
	w.expect("service pause web (image=local/busybox:latest, replicas=3, version=2)")
	w.write(ServiceKey("web"), SetServiceState{Service: "web", State: ServiceRollingBack}.Fields(at))
	w.expect("service rollback web (image=local/busybox:latest, replicas=3, version=2)")
	w.remove(ServiceKey("web"))
	w.expect("service remove web ()")
	w.remove(ServiceKey("web"))
	w.expect()

	// A task's life: created pending, running and healthy, restarted,
	// failed, removed; bookkeeping writes say nothing.
	r := Reserve{Service: "web", Slot: "1", TaskID: "web.abc", Version: 2, Spec: v2}
	w.write(TaskKey("web.abc"), NewTaskFields(r, "n1", at))
	w.expect("task create web.abc (image=local/busybox:latest, node=n1, service=web, slot=1, version=2)")
	w.write(TaskKey("web.abc"), UpdateTask{State: TaskStarting, Health: HealthStarting}.Fields())
	w.expect("task starting web.abc (image=local/busybox:latest, node=n1, service=web, slot=1, version=2)",
		"task health_status: starting web.abc (image=local/busybox:latest, node=n1, service=web, slot=1, version=2)")
	w.write(TaskKey("web.abc"), ClaimTask{TaskID: "web.abc", Against: "n2", At: at}.Fields())
	w.expect()
	w.write(TaskKey("web.abc"), UpdateTask{State: TaskRunning, Health: HealthHealthy}.Fields())
	w.expect("task running web.abc (image=local/busybox:latest, node=n1, service=web, slot=1, version=2)",
		"task health_status: healthy web.abc (image=local/busybox:latest, node=n1, service=web, slot=1, version=2)")
	w.write(TaskKey("web.abc"), UpdateTask{State: TaskRestarting, Health: HealthHealthy, Restarts: 1, ExitCode: 2, Error: "exit status 2"}.Fields())
	w.expect("task restarting web.abc (error=exit status 2, exit_code=2, image=local/busybox:latest, node=n1, restarts=1, service=web, slot=1, version=2)")
	w.write(TaskKey("web.abc"), UpdateTask{State: TaskRunning, Health: HealthHealthy, Restarts: 1}.Fields())
	w.expect("task running web.abc (image=local/busybox:latest, node=n1, restarts=1, service=web, slot=1, version=2)")
	w.write(TaskKey("web.abc"), UpdateTask{State: TaskFailed, Health: HealthHealthy, Restarts: 1, ExitCode: 137, Error: "killed"}.Fields())
	w.expect("task failed web.abc (error=killed, exit_code=137, image=local/busybox:latest, node=n1, restarts=1, service=web, slot=1, version=2)")
	w.remove(TaskKey("web.abc"))
	w.expect("task remove web.abc (image=local/busybox:latest, node=n1, service=web, slot=1, version=2)")

	// A node's: join, drained, labelled, shut down and up, removed.
	w.write(NodeKey("n1"), map[string]crdt.Value{fName: crdt.String("node-1")})
	w.expect("node join n1 (name=node-1)")
	w.write(NodeKey("n1"), NodeFields(Resources{CPUMillis: 2000}, Active))
	w.expect()
	w.write(NodeKey("n1"), map[string]crdt.Value{fAvailability: crdt.String(string(Drain)), fLabelPrefix + "zone": crdt.String("a")})
	w.expect("node update n1 (availability.new=drain, availability.old=active, label.zone=a, name=node-1)")
	w.write(NodeKey("n1"), ShutDownFields(true))
	w.expect("node shutdown n1 (name=node-1)")
	w.write(NodeKey("n1"), ShutDownFields(false))
	w.expect("node up n1 (name=node-1)")
	w.remove(NodeKey("n1"))
	w.expect("node remove n1 (name=node-1)")

	// Other documents make no events.
	w.write(SlotDocKey("web", "1"), map[string]crdt.Value{"task": crdt.String("web.abc")})
	w.write("/volumes/data", map[string]crdt.Value{"size": crdt.Int(1)})
	w.expect()
}
