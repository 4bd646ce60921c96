package ctl

import (
	"testing"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/statepb"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// A node whose scheduler said its machine shut down shows so beside
// membership's state, until it has left for good.
func TestNodeStateShowsAShutdown(t *testing.T) {
	doc := func(fields map[string]crdt.Value) *statev1.Document {
		d := &statev1.Document{Key: "/nodes/n1", Fields: map[string]*statev1.Value{}}
		for k, v := range fields {
			d.Fields[k] = statepb.ToValue(v)
		}
		return d
	}
	states := map[string]string{"n1": "alive"}
	for _, tc := range []struct {
		fields map[string]crdt.Value
		want   string
	}{
		{map[string]crdt.Value{"name": crdt.String("a")}, "alive"},
		{map[string]crdt.Value{"shutdown": crdt.Bool(false)}, "alive"},
		{map[string]crdt.Value{"shutdown": crdt.Bool(true)}, "alive (shut down)"},
		{map[string]crdt.Value{"shutdown": crdt.Bool(true), "left": crdt.Bool(true)}, "left"},
	} {
		v := nodeOf(doc(tc.fields), states)
		if got := v.stateText(); got != tc.want {
			t.Errorf("fields %v: state %q, want %q", tc.fields, got, tc.want)
		}
		if down, _ := tc.fields["shutdown"].AsBool(); v.ShutDown != down {
			t.Errorf("fields %v: ShutDown %v", tc.fields, v.ShutDown)
		}
	}
}
