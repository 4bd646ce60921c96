package sched_test

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/sched"
)

func TestDocsRoundTrip(t *testing.T) {
	at := func(d time.Duration, node string) crdt.Stamp { return stampAt(t0.Add(d), node) }

	// Service: a create, then an owner's rollback.
	spec := webSpec(3)
	prev := spec
	prev.Image = "img:0"
	svcDoc := crdt.Set(sched.ServiceFields(sched.Service{Name: "web", Spec: spec, PrevSpec: &prev, Version: 4, Updated: t0}), at(0, "cli"))
	svc, err := sched.ServiceFromDoc("web", svcDoc)
	if err != nil || svc == nil {
		t.Fatalf("ServiceFromDoc: %v %v", svc, err)
	}
	if svc.Spec.Digest() != spec.Digest() || svc.PrevSpec.Image != "img:0" || svc.Version != 4 || svc.State != sched.ServiceActive || !svc.Updated.Equal(t0) {
		t.Fatalf("service = %+v", svc)
	}
	rb := sched.SetServiceState{Service: "web", State: sched.ServiceRollingBack, Rollback: &sched.Rollback{Spec: prev, PrevSpec: spec, Version: 5}}
	svcDoc = crdt.Merge(svcDoc, crdt.Set(rb.Fields(t0.Add(time.Minute)), at(time.Minute, "n1")))
	svc, _ = sched.ServiceFromDoc("web", svcDoc)
	if svc.Spec.Image != "img:0" || svc.PrevSpec.Image != "img:1" || svc.Version != 5 || svc.State != sched.ServiceRollingBack {
		t.Fatalf("after rollback: %+v", svc)
	}
	// A scheduled job's run, then a create of the same name over it.
	run := sched.SetServiceState{Service: "web", State: sched.ServiceActive, Run: &sched.ScheduledRun{At: t0.Add(time.Minute), Version: 6, Slots: 3, Nodes: []string{"n1", "n2"}}}
	runDoc := crdt.Merge(svcDoc, crdt.Set(run.Fields(t0.Add(2*time.Minute)), at(2*time.Minute, "n1")))
	svc, _ = sched.ServiceFromDoc("web", runDoc)
	if !svc.Run.Equal(t0.Add(time.Minute)) || svc.RunVersion != 6 || svc.RunSlots != 3 || !slices.Equal(svc.RunNodes, []string{"n1", "n2"}) || svc.Version != 6 {
		t.Fatalf("after a run: %+v", svc)
	}
	runDoc = crdt.Merge(runDoc, crdt.Set(sched.ServiceFields(sched.Service{Name: "web", Spec: spec, Version: 1, Updated: t0}), at(3*time.Minute, "cli")))
	if svc, _ = sched.ServiceFromDoc("web", runDoc); svc.RunVersion != 0 || svc.RunSlots != 0 || svc.RunNodes != nil {
		t.Fatalf("a create kept the old run: %+v", svc)
	}
	if s, err := sched.ServiceFromDoc("web", crdt.Merge(svcDoc, crdt.DeleteDoc(at(time.Hour, "cli")))); s != nil || err != nil {
		t.Fatalf("deleted service decodes as %v, %v", s, err)
	}

	// Slot: the document's stamp is its last write.
	a := sched.AssignSlot{Service: "web", Slot: "2", Task: "t1", Node: "n1", Version: 4, Next: "t2", NextNode: "n3", NextVersion: 5}
	sl, ok := sched.SlotFromDoc("web", "2", crdt.Set(a.Fields(), at(time.Second, "n9")))
	want := sched.Slot{Service: "web", Slot: "2", Task: "t1", Node: "n1", Version: 4, Next: "t2", NextNode: "n3", NextVersion: 5, Stamp: at(time.Second, "n9")}
	if !ok || !reflect.DeepEqual(sl, want) {
		t.Fatalf("slot = %+v, want %+v", sl, want)
	}
	if svc, slot, ok := sched.ParseSlotDocKey(sched.SlotDocKey("web", "2")); !ok || svc != "web" || slot != "2" {
		t.Fatalf("ParseSlotDocKey = %q %q %v", svc, slot, ok)
	}

	// Task: created by the Reserve's target, then updated.
	r := sched.Reserve{Service: "web", Slot: "2", TaskID: "t1", Version: 4, Spec: spec, SpecDigest: spec.Digest(),
		Resources: spec.Resources(), Ports: []sched.Port{{Host: 8080, Container: 80, Protocol: "tcp", Mode: sched.PortHost}}, Restarts: 2,
		RestartTimes: []time.Time{t0.Add(-time.Minute), t0.Add(-time.Second)}}
	doc := crdt.Set(sched.NewTaskFields(r, "n1", t0), at(0, "n1"))
	u := sched.UpdateTask{TaskID: "t1", State: sched.TaskRunning, Health: sched.HealthHealthy, Restarts: 3, ExitCode: 1, Error: "x", Started: t0.Add(time.Second), Finished: t0.Add(time.Millisecond)}
	doc = crdt.Merge(doc, crdt.Set(u.Fields(), at(time.Second, "n1")))
	task, ok := sched.TaskFromDoc("t1", doc)
	wantTask := sched.Task{ID: "t1", Service: "web", Slot: "2", Node: "n1", Version: 4, SpecDigest: spec.Digest(),
		State: sched.TaskRunning, Health: sched.HealthHealthy, Restarts: 3, Inherited: 2, RestartTimes: r.RestartTimes, ExitCode: 1, Error: "x",
		Created: at(0, "n1"), Started: t0.Add(time.Second), Finished: t0.Add(time.Millisecond),
		Resources: spec.Resources(), Ports: r.Ports, Image: "img:1"}
	if !ok || !reflect.DeepEqual(task, wantTask) {
		t.Fatalf("task = %+v\nwant %+v", task, wantTask)
	}
	fresh, _ := sched.TaskFromDoc("t1", crdt.Set(sched.NewTaskFields(r, "n1", t0), at(0, "n1")))
	fresh.Created = crdt.Stamp{}
	if nt := sched.NewTask(r, "n1"); !reflect.DeepEqual(nt, fresh) {
		t.Fatalf("NewTask = %+v\nits document says %+v", nt, fresh)
	}
	if got := u.Apply(sched.Task{ID: "t1"}); got.State != sched.TaskRunning || got.Restarts != 3 {
		t.Fatalf("Apply = %+v", got)
	}

	// Node: statd's document plus schedd's fields and labels.
	nd := crdt.Set(map[string]crdt.Value{"name": crdt.String("alpha"), "hostname": crdt.String("h1"), "cpus": crdt.Int(4),
		"memory": crdt.Int(8 << 30), "label.zone": crdt.String("eu")}, at(0, "n1"))
	n := sched.NodeFromDoc("n1", nd, true)
	if n.Name != "alpha" || n.Hostname != "h1" || n.Labels["zone"] != "eu" || n.Capacity != (sched.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30}) ||
		n.Availability != sched.Active || !n.Alive {
		t.Fatalf("node = %+v", n)
	}
	nd = crdt.Merge(nd, crdt.Set(sched.NodeFields(sched.Resources{CPUMillis: 3500, MemoryBytes: 6 << 30}, sched.Drain), at(time.Second, "n1")))
	n = sched.NodeFromDoc("n1", nd, false)
	if n.Capacity != (sched.Resources{CPUMillis: 3500, MemoryBytes: 6 << 30}) || n.Availability != sched.Drain {
		t.Fatalf("node with schedd fields = %+v", n)
	}
}
