package ctl

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// filterKeys are the keys a list command's --filter takes, each with how
// an item of type T matches a value.
type filterKeys[T any] map[string]func(item T, value string) bool

// filterFlag registers docker's -f/--filter KEY=VALUE on a list command.
func filterFlag[T any](cmd *cobra.Command, raw *[]string, keys filterKeys[T]) {
	names := strings.Join(slices.Sorted(maps.Keys(keys)), ", ")
	cmd.Flags().StringArrayVarP(raw, "filter", "f", nil, "only what matches KEY=VALUE ("+names+"); values of one key are alternatives, different keys must all match")
}

// applyFilter keeps the items that match raw's filters, as docker does:
// an item must match one value of each key given. An unknown key or a
// filter without '=' is a usage error.
func applyFilter[T any](raw []string, keys filterKeys[T], items []T) ([]T, error) {
	if len(raw) == 0 {
		return items, nil
	}
	want := map[string][]string{}
	for _, f := range raw {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--filter %q: want KEY=VALUE", f)}
		}
		if _, known := keys[k]; !known {
			return nil, usageError{fmt.Errorf("--filter %q: unknown key %s: want one of %s", f, k, strings.Join(slices.Sorted(maps.Keys(keys)), ", "))}
		}
		want[k] = append(want[k], v)
	}
	out := items[:0:0]
	for _, it := range items {
		ok := true
		for k, values := range want {
			if !slices.ContainsFunc(values, func(v string) bool { return keys[k](it, v) }) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, it)
		}
	}
	return out, nil
}

// labelMatches matches docker's label=KEY (present) or label=KEY=VALUE.
func labelMatches(labels map[string]string, value string) bool {
	k, v, withValue := strings.Cut(value, "=")
	got, ok := labels[k]
	return ok && (!withValue || got == v)
}

// nameMatches matches a name or ID by its whole or its start, as
// docker's name and id filters do.
func nameMatches(name, value string) bool { return strings.HasPrefix(name, value) }

var serviceFilters = filterKeys[serviceView]{
	"name":  func(v serviceView, val string) bool { return nameMatches(v.Name, val) },
	"label": func(v serviceView, val string) bool { return labelMatches(v.Spec.Labels, val) },
	"mode":  func(v serviceView, val string) bool { return v.Spec.Mode() == val },
}

var taskFilters = filterKeys[*schedv1.Task]{
	"id": func(t *schedv1.Task, val string) bool { return nameMatches(t.GetId(), val) },
	"name": func(t *schedv1.Task, val string) bool {
		return t.GetService()+"."+t.GetSlot() == val || nameMatches(t.GetId(), val)
	},
	"node": func(t *schedv1.Task, val string) bool { return nameMatches(t.GetNode(), val) },
	// desired-state as docker's: running for the tasks a slot wants,
	// shutdown for those replaced or stopping.
	"desired-state": func(t *schedv1.Task, val string) bool {
		return (val == "running" && t.GetCurrent()) || (val == "shutdown" && !t.GetCurrent())
	},
	"state": func(t *schedv1.Task, val string) bool { return t.GetState() == val },
}

var nodeFilters = filterKeys[nodeView]{
	"id":           func(n nodeView, val string) bool { return nameMatches(n.ID, val) },
	"name":         func(n nodeView, val string) bool { return nameMatches(n.Name, val) },
	"label":        func(n nodeView, val string) bool { return labelMatches(n.Labels, val) },
	"availability": func(n nodeView, val string) bool { return n.Availability == val },
	"state":        func(n nodeView, val string) bool { return n.State == val },
}

var volumeFilters = filterKeys[volumeView]{
	"name":   func(v volumeView, val string) bool { return nameMatches(v.Name, val) },
	"health": func(v volumeView, val string) bool { return v.Health == val },
}

var secretFilters = filterKeys[secretView]{
	"name":  func(v secretView, val string) bool { return nameMatches(v.Name, val) },
	"label": func(v secretView, val string) bool { return labelMatches(v.Labels, val) },
}
