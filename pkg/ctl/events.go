package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func (a *app) eventsCommand() *cobra.Command {
	var format, since, until string
	var filters []string
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Follow what happens in the cluster: services, tasks and nodes",
		Long: `Print the cluster's events as they happen, as docker events does: services
created, updated, paused, rolled back, converged and removed; tasks created,
entering each state (starting, running, exited, failed, ...), changing health
and removed; nodes joining, drained, labelled, shut down, up and removed, and
their liveness as this node's failure detector sees it (alive, suspect,
dead, left; live only, not replayed).

The events are read from this node's statd, which holds every node's
changes: --since replays those it still keeps (its last 100,000 changes by
default, watch_history), --until stops at a time (at once, if it is past,
once the replay is done). Filters (-f KEY=VALUE, repeatable; one key's values
are alternatives, different keys must all match): type=service|task|node,
service=NAME (the service and its tasks), node=ID|NAME (the node and its
tasks), task=ID (or a prefix), event=ACTION.`,
		Example: `  shoalctl events
  shoalctl events --since 10m --until 0s -f service=web
  shoalctl events -f type=task -f event=failed -f event=unhealthy -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkStreamFormat(format); err != nil {
				return err
			}
			now := time.Now()
			var from, to time.Time
			var err error
			if since != "" {
				if from, err = parseLogTime(since, now); err != nil {
					return usageError{fmt.Errorf("--since: %w", err)}
				}
			}
			if until != "" {
				if to, err = parseLogTime(until, now); err != nil {
					return usageError{fmt.Errorf("--until: %w", err)}
				}
				if !from.IsZero() && to.Before(from) {
					return usageError{fmt.Errorf("--until %s is before --since %s", until, since)}
				}
			}
			match, err := parseEventFilters(filters)
			if err != nil {
				return usageError{err}
			}
			return a.followEvents(cmd.Context(), from, to, match, format)
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table (a line an event), json (an object a line) or template=GO-TEMPLATE")
	cmd.Flags().Var(dockerFormat{&format}, "format", "print each event with a Go template, as docker's --format ('{{.Type}} {{.Action}} {{.ID}}')")
	cmd.Flags().StringVar(&since, "since", "", "replay the events since a time (10m, 2026-12-07T10:00:00Z, Unix seconds)")
	cmd.Flags().StringVar(&until, "until", "", "stop at a time (0s: now)")
	cmd.Flags().StringArrayVarP(&filters, "filter", "f", nil, "only events matching KEY=VALUE (type, service, node, task, event)")
	return cmd
}

// eventFilter matches events: per key, any of its values.
type eventFilter map[string][]string

var eventFilterKeys = []string{"type", "service", "node", "task", "event"}

func parseEventFilters(in []string) (eventFilter, error) {
	f := eventFilter{}
	for _, s := range in {
		k, v, ok := strings.Cut(s, "=")
		if !ok || v == "" || !slices.Contains(eventFilterKeys, k) {
			return nil, fmt.Errorf("--filter %q: want KEY=VALUE, KEY one of %s", s, strings.Join(eventFilterKeys, ", "))
		}
		if k == "type" && v != sched.EventService && v != sched.EventTask && v != sched.EventNode {
			return nil, fmt.Errorf("--filter %q: type is service, task or node", s)
		}
		f[k] = append(f[k], v)
	}
	return f, nil
}

// matches reports whether e passes every key of f; nodeNames maps node
// IDs to names, for node=NAME.
func (f eventFilter) matches(e sched.Event, nodeNames map[string]string) bool {
	anyOf := func(key string, ok func(v string) bool) bool {
		vs, set := f[key]
		return !set || slices.ContainsFunc(vs, ok)
	}
	node := e.Attributes["node"]
	if e.Type == sched.EventNode {
		node = e.ID
	}
	return anyOf("type", func(v string) bool { return v == e.Type }) &&
		anyOf("event", func(v string) bool { return v == e.Action || strings.TrimPrefix(e.Action, "health_status: ") == v }) &&
		anyOf("service", func(v string) bool {
			return (e.Type == sched.EventService && e.ID == v) || (e.Type == sched.EventTask && e.Attributes["service"] == v)
		}) &&
		anyOf("node", func(v string) bool { return node != "" && (node == v || nodeNames[node] == v) }) &&
		anyOf("task", func(v string) bool { return e.Type == sched.EventTask && strings.HasPrefix(e.ID, v) })
}

// eventDocs are the documents of services, tasks and nodes as far as the
// events went, by key, and the nodes' names.
type eventDocs struct {
	docs  map[string]crdt.Doc
	revs  map[string]uint64
	names map[string]string
}

func newEventDocs() eventDocs {
	return eventDocs{docs: map[string]crdt.Doc{}, revs: map[string]uint64{}, names: map[string]string{}}
}

// set records key's document as of revision rev.
func (d eventDocs) set(key string, doc crdt.Doc, rev uint64) {
	d.docs[key], d.revs[key] = doc, rev
	if id, ok := strings.CutPrefix(key, sched.NodesPrefix); ok {
		if n := sched.NodeFromDoc(id, doc, true); n.Name != "" {
			d.names[id] = n.Name
		}
	}
}

// apply takes a watched change and returns its events; a change older
// than what the documents already hold (seen by the list) makes none, and
// documents of other kinds are not kept.
func (d eventDocs) apply(e *statev1.Event) []sched.Event {
	doc := e.GetDocument()
	key := doc.GetKey()
	if e.GetRevision() <= d.revs[key] || !followed(key) {
		return nil
	}
	before := d.docs[key]
	after := crdt.Doc{}
	at := statepb.FromStamp(doc.GetUpdated()).TS.Time()
	if e.GetType() == statev1.Event_TYPE_DELETE {
		at = statepb.FromStamp(doc.GetDeleted()).TS.Time()
	} else {
		after = statepb.FromDocument(doc)
	}
	d.set(key, after, e.GetRevision())
	return sched.DocEvents(key, before, after, at)
}

var followedPrefixes = []string{sched.ServicesPrefix, sched.TasksPrefix, sched.NodesPrefix}

func followed(key string) bool {
	return slices.ContainsFunc(followedPrefixes, func(p string) bool { return strings.HasPrefix(key, p) })
}

// followEvents prints the events from since (zero: from now) until
// (zero: until interrupted) that match.
func (a *app) followEvents(ctx context.Context, since, until time.Time, match eventFilter, format string) error {
	c, err := a.statd()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Status(ctx, &statev1.StatusRequest{})
	if err != nil {
		return err
	}
	docs := newEventDocs()
	after := st.GetRevision()
	if since.IsZero() {
		// From now: the documents as they are, for the first change of
		// each to be told against.
		for _, prefix := range followedPrefixes {
			if err := listAll(ctx, c, prefix, false, func(d *statev1.Document) bool {
				docs.set(d.GetKey(), statepb.FromDocument(d), d.GetRevision())
				return true
			}); err != nil {
				return err
			}
		}
	} else if oldest := st.GetOldestRevision(); oldest > 0 {
		after = oldest - 1 // replay what statd keeps; events before since only set the documents
	}
	caughtUp := st.GetRevision() // the replay's end
	if !until.IsZero() {
		wait := time.Until(until)
		if wait <= 0 && caughtUp <= after {
			return nil // nothing to replay, and no time to wait
		}
		if wait > 0 {
			timer := time.AfterFunc(wait, cancel)
			defer timer.Stop()
		}
	}
	enc := json.NewEncoder(a.out)
	errDone := errors.New("until reached")
	// mu keeps the documents and the output to one goroutine at a time:
	// the watch's, or the membership poller's.
	var mu sync.Mutex
	emit := func(e sched.Event) error {
		if e.Time.Before(since) {
			return nil
		}
		if !until.IsZero() && e.Time.After(until) {
			return errDone
		}
		if !match.matches(e, docs.names) {
			return nil
		}
		return printEvent(a, enc, format, e)
	}
	if until.IsZero() || until.After(time.Now()) {
		// The members' states now, before the watch starts: a change
		// from then on is an event.
		first, _ := c.Cluster.Status(ctx, &clusterv1.StatusRequest{})
		go a.followMembers(ctx, c, memberStates(first), func(e sched.Event) {
			mu.Lock()
			defer mu.Unlock()
			if name := docs.names[e.ID]; name != "" {
				e.Attributes["name"] = name
			}
			if err := emit(e); err != nil {
				cancel()
			}
		})
	}
	err = c.Watch(ctx, "", after, func(resp *statev1.WatchResponse) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range resp.GetEvents() {
			for _, e := range docs.apply(ev) {
				if err := emit(e); err != nil {
					return err
				}
			}
			if !until.IsZero() && !until.After(time.Now()) && ev.GetRevision() >= caughtUp {
				return errDone
			}
		}
		return nil
	})
	if errors.Is(err, errDone) || (err != nil && ctx.Err() != nil) {
		return nil // until reached, or interrupted
	}
	return err
}

// membersPoll is how often events asks statd for the members' liveness,
// which it keeps in no document to watch.
const membersPoll = time.Second

// followMembers reports each change of a member's liveness from last as
// this node sees it (alive, suspect, dead, left) until ctx ends: statd's
// failure detector, polled. With last nil, the first look makes no events.
func (a *app) followMembers(ctx context.Context, c *client.Statd, last map[string]string, emit func(sched.Event)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(membersPoll):
		}
		st, err := c.Cluster.Status(ctx, &clusterv1.StatusRequest{})
		if err != nil {
			continue // statd restarting: the next look tells what changed
		}
		for _, e := range memberEvents(last, st.GetMembers()) {
			emit(e)
		}
		last = memberStates(st)
	}
}

// memberStates maps the members of st to their states; nil without st.
func memberStates(st *clusterv1.StatusResponse) map[string]string {
	if st == nil {
		return nil
	}
	out := map[string]string{}
	for _, m := range st.GetMembers() {
		out[m.GetId()] = m.GetState()
	}
	return out
}

// memberEvents are the liveness changes from the states last (nil: none
// known yet, so no events) to members.
func memberEvents(last map[string]string, members []*clusterv1.MemberStatus) []sched.Event {
	if last == nil {
		return nil
	}
	var out []sched.Event
	for _, m := range members {
		if prev, ok := last[m.GetId()]; ok && prev == m.GetState() {
			continue
		}
		at := time.Now()
		if m.GetSince() != nil {
			at = m.GetSince().AsTime()
		}
		out = append(out, sched.Event{Time: at, Type: sched.EventNode, Action: m.GetState(), ID: m.GetId(),
			Attributes: map[string]string{"addr": m.GetAddr()}})
	}
	return out
}

// printEvent prints e as docker events does (time, type, action, ID,
// attributes), or as a JSON object a line.
func printEvent(a *app, enc *json.Encoder, format string, e sched.Event) error {
	if format == "json" {
		return enc.Encode(e)
	}
	if text, ok := strings.CutPrefix(format, templatePrefix); ok {
		return renderTemplate(a.out, text, e)
	}
	line := fmt.Sprintf("%s %s %s %s", e.Time.UTC().Format(time.RFC3339Nano), e.Type, e.Action, e.ID)
	if len(e.Attributes) > 0 {
		var attrs []string
		for _, k := range slices.Sorted(maps.Keys(e.Attributes)) {
			attrs = append(attrs, k+"="+e.Attributes[k])
		}
		line += " (" + strings.Join(attrs, ", ") + ")"
	}
	_, err := fmt.Fprintln(a.out, line)
	return err
}
