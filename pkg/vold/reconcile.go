package vold

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// docCache memoizes decoded volume documents by key and encoded text.
// Reconcile (every second) and repair (every repair_interval) read every
// document each round; decoding them all again dominated an idle vold's
// CPU with a thousand volumes. Callers get copies, so they may change
// what they get.
type docCache struct {
	mu sync.Mutex
	m  map[string]cachedDoc
}

type cachedDoc struct {
	text docText
	doc  *volumeDoc
}

// decode returns decodeVolume(d), from the cache when d's text has not
// changed since it was last decoded.
func (c *docCache) decode(d *statev1.Document) (*volumeDoc, error) {
	key, text := d.GetKey(), textOf(d)
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if ok && e.text == text {
		return e.doc.clone(), nil
	}
	v, err := decodeVolume(d)
	if err != nil || v == nil {
		return v, err
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]cachedDoc{}
	}
	c.m[key] = cachedDoc{text: text, doc: v.clone()}
	c.mu.Unlock()
	return v, nil
}

// keep drops the entries of documents not in keys (removed volumes).
func (c *docCache) keep(keys map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if !keys[k] {
			delete(c.m, k)
		}
	}
}

func (d *volumeDoc) clone() *volumeDoc {
	c := *d
	c.Members = slices.Clone(d.Members)
	return &c
}

// volumeDocs returns the volume documents in the mirror by name (the
// system group's included); undecodable ones are logged and skipped.
func (n *node) volumeDocs() map[string]*volumeDoc {
	out := map[string]*volumeDoc{}
	seen := map[string]bool{}
	for _, d := range n.mirror.List(volumesPrefix) {
		seen[d.GetKey()] = true
		name := strings.TrimPrefix(d.GetKey(), volumesPrefix)
		v, err := n.docs.decode(d)
		if err != nil {
			n.log.Warn("bad volume document", "volume", name, "err", err)
			continue
		}
		if v != nil {
			out[name] = v
		}
	}
	n.docs.keep(seen)
	return out
}

func (n *node) allVolumeDocs() []*volumeDoc {
	var out []*volumeDoc
	for _, d := range n.volumeDocs() {
		out = append(out, d)
	}
	return out
}

// volumeDoc returns one volume's document from the mirror, nil if none.
func (n *node) volumeDoc(name string) *volumeDoc {
	d := n.mirror.Get(volumeKey(name))
	if d == nil {
		return nil
	}
	v, err := n.docs.decode(d)
	if err != nil {
		n.log.Warn("bad volume document", "volume", name, "err", err)
		return nil
	}
	return v
}

// reconcile makes this node's replicas match the volume documents: a
// member that has no replica creates it (initial members bootstrap the
// group together) or joins empty (members added by repair); a replica
// whose group no document places here any more is destroyed, and one that
// its group removed once its group is done with it (Removed).
func (n *node) reconcile(ctx context.Context) {
	h := n.host.Load()
	if h == nil || ctx.Err() != nil {
		return
	}
	// Learn every node's ID string, so that Raft node numbers map back to
	// them exactly (leading zeros included).
	for _, d := range n.mirror.List(nodesPrefix) {
		_, _ = n.names.add(strings.TrimPrefix(d.GetKey(), nodesPrefix))
	}
	want := map[raftgroup.GroupID]*volumeDoc{}
	all := map[raftgroup.GroupID]*volumeDoc{}
	names := map[raftgroup.GroupID]string{}
	for name, d := range n.volumeDocs() {
		all[d.group()] = d
		if _, ok := d.member(n.id); ok {
			want[d.group()] = d
			names[d.group()] = name
		}
	}
	have := map[raftgroup.GroupID]bool{}
	for _, g := range h.Groups() {
		have[g] = true
	}
	for g, d := range want {
		if have[g] {
			continue
		}
		m, _ := d.member(n.id)
		var err error
		if m.Boot {
			var boot []raftgroup.Member
			boot, err = d.bootMembers(n.names)
			if err == nil {
				err = h.CreateGroup(g, raftgroup.ReplicaID(m.Replica), boot)
			}
		} else {
			err = h.JoinGroup(g, raftgroup.ReplicaID(m.Replica))
		}
		if err != nil {
			if n.failed[g] != err.Error() {
				n.log.Warn("cannot create replica", "volume", names[g], "group", uint64(g), "replica", m.Replica, "err", err)
				n.failed[g] = err.Error()
			}
			continue
		}
		delete(n.failed, g)
		n.stats.created.Add(1)
		n.log.Info("replica created", "volume", names[g], "group", uint64(g), "replica", m.Replica, "boot", m.Boot)
	}
	for g := range n.failed {
		if want[g] == nil {
			delete(n.failed, g)
		}
	}
	for g := range have {
		st, err := h.Brief(g)
		if err != nil {
			continue
		}
		reason := ""
		d := all[g]
		m, placed := docMember{}, false
		if d != nil {
			m, placed = d.member(n.id)
		}
		switch {
		case st.Removed:
			reason = "removed from group"
		case !n.synced.Load():
			// NB: only once statd has synced since start; before that a
			// missing document may just not have arrived yet.
		case placed && raftgroup.ReplicaID(m.Replica) > st.Replica:
			// The group placed a newer replica here, which can start only
			// once this one is gone.
			if !st.Retiring {
				n.retire(h, g, d)
			}
			reason = "replaced by a newer replica on this node"
		case d != nil && !placed:
			// The group removed this replica. It votes until every voter
			// knows (raftgroup's retiring.go), then it is Removed.
			if !st.Retiring {
				n.retire(h, g, d)
			}
		case d == nil:
			reason = "no volume places it here"
		}
		if reason == "" {
			continue
		}
		if err := n.destroyReplica(g); err != nil {
			n.log.Warn("destroy replica", "group", uint64(g), "err", err)
			continue
		}
		n.log.Info("replica destroyed", "group", uint64(g), "reason", reason)
	}
}

// retire tells the host that d, the group's document, no longer places
// this node's replica of g, with the members it places instead.
func (n *node) retire(h *raftgroup.Host, g raftgroup.GroupID, d *volumeDoc) {
	var voters []raftgroup.Member
	for _, m := range d.Members {
		if m.Learner {
			continue
		}
		id, err := n.names.add(m.Node)
		if err != nil {
			continue
		}
		voters = append(voters, raftgroup.Member{Replica: raftgroup.ReplicaID(m.Replica), Node: id})
	}
	if err := h.Retire(g, voters); err != nil {
		n.log.Warn("retire replica", "group", uint64(g), "err", err)
		return
	}
	n.log.Info("replica retiring: it votes until the group's voters know it was removed", "group", uint64(g))
}

// destroyReplica deletes this node's replica of g and forgets what
// belongs to it.
func (n *node) destroyReplica(g raftgroup.GroupID) error {
	h := n.host.Load()
	if err := h.DestroyGroup(g); err != nil && !errors.Is(err, raftgroup.ErrGroupNotFound) {
		return err
	}
	n.kvMu.Lock()
	delete(n.kvs, g)
	n.kvMu.Unlock()
	n.leaders.Delete(g)
	n.stats.destroyed.Add(1)
	return nil
}
