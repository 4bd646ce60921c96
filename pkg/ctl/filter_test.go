package ctl

import (
	"errors"
	"slices"
	"testing"

	"github.com/shoal-dev/shoal/pkg/sched"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// TestApplyFilter: docker's semantics, values of one key alternatives and
// keys all required; name and id by their start; labels present or
// equal.
func TestApplyFilter(t *testing.T) {
	svc := func(name string, global bool, labels map[string]string) serviceView {
		return serviceView{Name: name, Spec: sched.ServiceSpec{Name: name, Global: global, Labels: labels}}
	}
	views := []serviceView{
		svc("web", false, map[string]string{"tier": "front"}),
		svc("web-admin", false, map[string]string{"tier": "back"}),
		svc("agent", true, nil),
		svc("db", false, map[string]string{"tier": "back", "backup": ""}),
	}
	names := func(vs []serviceView) []string {
		var out []string
		for _, v := range vs {
			out = append(out, v.Name)
		}
		return out
	}
	for _, c := range []struct {
		filters []string
		want    []string
	}{
		{nil, []string{"web", "web-admin", "agent", "db"}},
		{[]string{"name=web"}, []string{"web", "web-admin"}},
		{[]string{"name=web", "name=db"}, []string{"web", "web-admin", "db"}},
		{[]string{"name=web", "label=tier=back"}, []string{"web-admin"}},
		{[]string{"label=backup"}, []string{"db"}},
		{[]string{"mode=global"}, []string{"agent"}},
		{[]string{"label=tier=middle"}, nil},
	} {
		got, err := applyFilter(c.filters, serviceFilters, slices.Clone(views))
		if err != nil || !slices.Equal(names(got), c.want) {
			t.Errorf("%v: %v, %v; want %v", c.filters, names(got), err, c.want)
		}
	}
	for _, bad := range []string{"colour=red", "name"} {
		var u usageError
		if _, err := applyFilter([]string{bad}, serviceFilters, views); !errors.As(err, &u) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}

	tasks := []*schedv1.Task{
		{Id: "web.1a2b", Service: "web", Slot: "1", Node: "n1abc", State: "running", Current: true},
		{Id: "web.3c4d", Service: "web", Slot: "1", Node: "n2def", State: "failed"},
		{Id: "web.5e6f", Service: "web", Slot: "2", Node: "n1abc", State: "running", Current: true},
	}
	for _, c := range []struct {
		filters []string
		want    int
	}{
		{[]string{"desired-state=running"}, 2},
		{[]string{"desired-state=shutdown"}, 1},
		{[]string{"name=web.1"}, 2},
		{[]string{"node=n1", "state=running"}, 2},
		{[]string{"id=web.3"}, 1},
	} {
		if got, err := applyFilter(c.filters, taskFilters, tasks); err != nil || len(got) != c.want {
			t.Errorf("%v: %d tasks, %v; want %d", c.filters, len(got), err, c.want)
		}
	}
}
