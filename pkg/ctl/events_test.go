package ctl

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/sched"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func TestEventFilters(t *testing.T) {
	f, err := parseEventFilters([]string{"type=task", "type=service", "service=web", "event=failed", "event=running", "event=create"})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{"id1": "n1"}
	for _, tc := range []struct {
		e    sched.Event
		want bool
	}{
		{sched.Event{Type: "task", Action: "running", ID: "web.a", Attributes: map[string]string{"service": "web", "node": "id1"}}, true},
		{sched.Event{Type: "task", Action: "starting", ID: "web.a", Attributes: map[string]string{"service": "web"}}, false},
		{sched.Event{Type: "task", Action: "failed", ID: "db.a", Attributes: map[string]string{"service": "db"}}, false},
		{sched.Event{Type: "service", Action: "create", ID: "web"}, true},
		{sched.Event{Type: "node", Action: "create", ID: "id1"}, false},
	} {
		if got := f.matches(tc.e, names); got != tc.want {
			t.Errorf("%+v: matched %v, want %v", tc.e, got, tc.want)
		}
	}
	byNode, _ := parseEventFilters([]string{"node=n1", "event=healthy"})
	if !byNode.matches(sched.Event{Type: "task", Action: "health_status: healthy", Attributes: map[string]string{"node": "id1"}}, names) ||
		byNode.matches(sched.Event{Type: "task", Action: "health_status: healthy", Attributes: map[string]string{"node": "id2"}}, names) {
		t.Error("node=NAME with event=healthy")
	}
	for _, bad := range []string{"type=volume", "colour=red", "service=", "service"} {
		if _, err := parseEventFilters([]string{bad}); err == nil {
			t.Errorf("filter %q accepted", bad)
		}
	}
}

// TestEventDocsOrder: a change the list already showed, or an older one,
// makes no event; documents of other kinds are not kept.
func TestEventDocsOrder(t *testing.T) {
	d := newEventDocs()
	at := &statev1.Stamp{Wall: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC).UnixNano()}
	put := func(rev uint64, key string, fields map[string]*statev1.Value) *statev1.Event {
		return &statev1.Event{Type: statev1.Event_TYPE_PUT, Revision: rev, Document: &statev1.Document{Key: key, Fields: fields, Revision: rev, Updated: at}}
	}
	str := func(s string) *statev1.Value { return &statev1.Value{Kind: &statev1.Value_StringValue{StringValue: s}} }
	if ev := d.apply(put(5, sched.NodeKey("id1"), map[string]*statev1.Value{"name": str("n1")})); len(ev) != 1 || ev[0].Action != "join" || !ev[0].Time.Equal(time.Unix(0, at.Wall)) {
		t.Fatalf("join: %+v", ev)
	}
	if d.names["id1"] != "n1" {
		t.Errorf("names %v", d.names)
	}
	if ev := d.apply(put(4, sched.NodeKey("id1"), map[string]*statev1.Value{"name": str("old")})); len(ev) != 0 || d.names["id1"] != "n1" {
		t.Errorf("an older change: %+v, names %v", ev, d.names)
	}
	d.apply(put(6, sched.SlotDocKey("web", "1"), map[string]*statev1.Value{"task": str("x")}))
	if len(d.docs) != 1 {
		t.Errorf("kept %d documents, want the node's only", len(d.docs))
	}
	del := &statev1.Event{Type: statev1.Event_TYPE_DELETE, Revision: 7, Document: &statev1.Document{Key: sched.NodeKey("id1"), Deleted: at}}
	if ev := d.apply(del); len(ev) != 1 || ev[0].Action != "remove" || ev[0].Attributes["name"] != "n1" {
		t.Errorf("remove: %+v", ev)
	}
}

func TestEventsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-f", "type=volume"}, "--filter"},
		{[]string{"--since", "soon"}, "--since"},
		{[]string{"--since", "1m", "--until", "1h"}, "before --since"},
		{[]string{"-o", "yaml"}, "output format"},
	} {
		_, errOut, code := ctlRun(t, append([]string{"--run-dir", t.TempDir(), "events"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.says) {
			t.Errorf("%v: exit %d, %q; want a usage error saying %q", tc.args, code, errOut, tc.says)
		}
	}
}

// TestMemberEvents: the first look makes none; then each member whose
// state changed, or who is new, makes one, stamped when it changed.
func TestMemberEvents(t *testing.T) {
	since := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	members := []*clusterv1.MemberStatus{
		{Id: "a", State: "alive", Addr: "10.0.0.1:7946"},
		{Id: "b", State: "dead", Addr: "10.0.0.2:7946", Since: timestamppb.New(since)},
		{Id: "c", State: "alive"},
	}
	if ev := memberEvents(nil, members); len(ev) != 0 {
		t.Errorf("first look: %+v", ev)
	}
	ev := memberEvents(map[string]string{"a": "alive", "b": "alive"}, members)
	if len(ev) != 2 || ev[0].ID != "b" || ev[0].Action != "dead" || !ev[0].Time.Equal(since) || ev[0].Attributes["addr"] != "10.0.0.2:7946" ||
		ev[1].ID != "c" || ev[1].Action != "alive" || ev[1].Type != sched.EventNode {
		t.Errorf("changes: %+v", ev)
	}
}
