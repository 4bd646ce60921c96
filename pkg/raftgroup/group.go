package raftgroup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/confchange"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Bootstrap position of a new group: every initial member starts from the
// same snapshot at (bootIndex, bootTerm) holding the initial membership,
// so that replicas added later always catch up by snapshot.
const (
	bootIndex = 1
	bootTerm  = 1
)

// group is one replica of a Raft group on this host. Owned by the loop.
type group struct {
	h       *Host
	id      GroupID
	replica ReplicaID
	rn      *raft.RawNode
	st      *groupStorage
	fsm     StateMachine

	// Replicated state the host owns, as of applied.
	meta      *groupMeta
	confState *pb.ConfState
	applied   uint64
	// lastConfIndex is the index of the last configuration applied (a
	// snapshot must cover it to be of use to a replica it added).
	lastConfIndex uint64

	// learned routes replicas not (yet) in meta.members: a new replica
	// learns its leader's node from the leader's first message.
	learned map[ReplicaID]NodeID
	leader  ReplicaID
	// leaderTick is the host tick at which leader last changed; proposed
	// counts the window's proposals by replica while this one leads, and
	// proposedBytes their entry data; run is the latest run of proposals
	// from one replica (follow.go).
	leaderTick    uint64
	proposed      map[ReplicaID]int
	proposedBytes map[ReplicaID]int
	run           proposalRun
	removed       bool
	// retiring is set while the replica knows it was removed but may
	// still be needed for a vote (retiring.go); removed replaces it.
	retiring *retirement
	broken   error
	// retired is set with removed, retiring or broken: Host.Serves reads it
	// off the loop.
	retired     atomic.Bool
	quiesced    bool
	idleTicks   int
	quiesceHint *Heartbeat
	retryNow    bool
	// logBytes counts the entry data applied since the last snapshot
	// maybeCompact took, snapBytes is that snapshot's size.
	logBytes, snapBytes uint64
	// bgSnap is the snapshot being written off the loop (bgsnapshot.go).
	bgSnap *bgSnapshot

	// Pending requests of local callers.
	proposals   map[string]*pendingProposal
	readQueue   []*Future[uint64] // reads waiting for the next ReadIndex
	readsSent   map[uint64]*readBatch
	confs       map[string]*pendingConf
	joint       []*pendingConf // applied, waiting for the joint config to be left
	quorum      []*quorumWaiter
	peerApplied map[ReplicaID]uint64
}

// CreateGroup bootstraps a replica of a new group whose initial members
// are members (local must be one of them, placed on this node). Every
// initial member must be created with the same members.
func (h *Host) CreateGroup(id GroupID, local ReplicaID, members []Member) error {
	seen := map[ReplicaID]bool{}
	found := false
	var maxID ReplicaID
	for _, m := range members {
		if m.Replica == 0 || m.Node == 0 || seen[m.Replica] {
			return fmt.Errorf("raftgroup: bad member %+v: %w", m, ErrInvalidChange)
		}
		seen[m.Replica] = true
		maxID = max(maxID, m.Replica)
		if m.Replica == local {
			if m.Node != h.cfg.NodeID {
				return fmt.Errorf("raftgroup: replica %d is placed on node %d, not this node %d: %w", local, m.Node, h.cfg.NodeID, ErrInvalidChange)
			}
			found = true
		}
	}
	if !found {
		return fmt.Errorf("raftgroup: replica %d is not among the members: %w", local, ErrInvalidChange)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.checkNew(id, local); err != nil {
		return err
	}
	meta := newGroupMeta()
	cs := &pb.ConfState{}
	for _, m := range members {
		meta.members[m.Replica] = m.Node
		cs.Voters = append(cs.Voters, uint64(m.Replica))
	}
	slices.Sort(cs.Voters)
	meta.maxReplica = maxID
	sd := snapshotData{meta: meta}
	snap := &pb.Snapshot{
		Data:     sd.encode(),
		Metadata: &pb.SnapshotMetadata{Index: new(uint64(bootIndex)), Term: new(uint64(bootTerm)), ConfState: pb.EnsureConfState(cs)},
	}
	snapBytes, err := proto.Marshal(snap)
	if err != nil {
		return err
	}
	hs, err := proto.Marshal(&pb.HardState{Term: new(uint64(bootTerm)), Vote: new(uint64(0)), Commit: new(uint64(bootIndex))})
	if err != nil {
		return err
	}
	b := h.db.NewBatch()
	defer b.Close()
	_ = b.Set(h.ks.groupKey(id, sufMeta), replicaRecord{replica: local}.encode(), nil)
	_ = b.Set(h.ks.groupKey(id, sufSnapshot), snapBytes, nil)
	_ = b.Set(h.ks.groupKey(id, sufTruncated), truncState{bootIndex, bootTerm}.encode(), nil)
	_ = b.Set(h.ks.groupKey(id, sufHardState), hs, nil)
	if err := h.commit(b, true); err != nil {
		return fmt.Errorf("raftgroup: create group %d: %w", id, err)
	}
	_, err = h.openGroup(id, local)
	return err
}

// JoinGroup creates an empty replica of an existing group. It stays idle
// until the group adds it (ChangeMembership on a member, with this node)
// and its leader sends it a snapshot.
func (h *Host) JoinGroup(id GroupID, local ReplicaID) error {
	if local == 0 {
		return fmt.Errorf("raftgroup: replica ID 0: %w", ErrInvalidChange)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.checkNew(id, local); err != nil {
		return err
	}
	b := h.db.NewBatch()
	defer b.Close()
	_ = b.Set(h.ks.groupKey(id, sufMeta), replicaRecord{replica: local}.encode(), nil)
	if err := h.commit(b, true); err != nil {
		return fmt.Errorf("raftgroup: join group %d: %w", id, err)
	}
	_, err := h.openGroup(id, local)
	return err
}

// DestroyGroup deletes this host's replica of a group (after it was
// removed from the group, or the group was retired) and leaves a
// tombstone so that its replica ID cannot come back here.
func (h *Host) DestroyGroup(id GroupID) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return ErrClosed
	}
	g := h.groups[id]
	if g == nil {
		return ErrGroupNotFound
	}
	g.failPending(ErrRemoved)
	b := h.db.NewBatch()
	defer b.Close()
	_ = b.DeleteRange(h.ks.groupPrefix(id), h.ks.groupEnd(id), nil)
	_ = b.Set(h.ks.tombstoneKey(id), binary.AppendUvarint(nil, uint64(g.replica)), nil)
	if err := h.commit(b, true); err != nil {
		return fmt.Errorf("raftgroup: destroy group %d: %w", id, err)
	}
	h.jnl.dropGroup(id)
	delete(h.groups, id)
	h.index.Delete(id)
	delete(h.awake, id)
	delete(h.dirty, id)
	delete(h.busy, id)
	delete(h.retiring, id)
	delete(h.appliedSome, id)
	delete(h.attention, id)
	h.peersStale = true
	return nil
}

// checkNew refuses to create a replica that exists or was destroyed.
func (h *Host) checkNew(id GroupID, local ReplicaID) error {
	if h.stopped {
		return ErrClosed
	}
	if h.err != nil {
		return h.err
	}
	if _, ok := h.groups[id]; ok {
		return ErrGroupExists
	}
	v, err := get(h.db, h.ks.tombstoneKey(id))
	if err != nil {
		return err
	}
	if v != nil {
		dead, _ := binary.Uvarint(v)
		if uint64(local) <= dead {
			return fmt.Errorf("raftgroup: group %d had replica %d here: %w", id, dead, ErrReplicaIDReused)
		}
	}
	return nil
}

// openGroup loads a group's replica from storage and starts its RawNode.
func (h *Host) openGroup(id GroupID, local ReplicaID) (*group, error) {
	st, err := loadStorage(h.db, h.ks, id, h.jnl, h.cfg.LargeEntry)
	if err != nil {
		return nil, err
	}
	g := &group{
		h:           h,
		id:          id,
		replica:     local,
		st:          st,
		fsm:         h.cfg.NewStateMachine(id),
		meta:        newGroupMeta(),
		confState:   pb.EnsureConfState(nil),
		learned:     map[ReplicaID]NodeID{},
		proposals:   map[string]*pendingProposal{},
		readsSent:   map[uint64]*readBatch{},
		confs:       map[string]*pendingConf{},
		peerApplied: map[ReplicaID]uint64{},
	}
	if st.snap != nil {
		snap, err := st.loadSnapshot()
		if err != nil {
			return nil, err
		}
		if err := g.restoreState(snap); err != nil {
			return nil, err
		}
	}
	st.snapshotFor = g.snapshotForSend
	rn, err := raft.NewRawNode(h.raftConfig(local, st, g.applied))
	if err != nil {
		return nil, err
	}
	g.rn = rn
	h.groups[id] = g
	h.index.Store(id, g)
	h.awake[id] = g
	h.dirty[id] = g
	h.peersStale = true
	g.checkMembership()
	if g.soleVoter() {
		// No one else can lead, and no one else's vote is needed: not
		// waiting out an election timeout spares a restarted host's
		// single-replica groups a second or two without a leader (a
		// volume's mount waits that long).
		_ = rn.Campaign()
	}
	return g, nil
}

// soleVoter reports whether this replica is its group's only voter, with
// no configuration change under way.
func (g *group) soleVoter() bool {
	cfg := g.rn.Status().Config
	_, in := cfg.Voters[0][uint64(g.replica)]
	return in && len(cfg.Voters[0]) == 1 && len(cfg.Voters[1]) == 0 && len(cfg.Learners) == 0
}

// initialized reports whether the replica has state (a bootstrap or a
// received snapshot); a joining replica is not initialized before its
// first snapshot.
func (g *group) initialized() bool { return g.st.snap != nil }

// nodeOf routes a replica of the group.
func (g *group) nodeOf(r ReplicaID) (NodeID, bool) {
	if n, ok := g.meta.members[r]; ok {
		return n, true
	}
	n, ok := g.learned[r]
	return n, ok
}

// isRemovedReplica reports whether r was a member and is not any more:
// replica IDs only grow, so any ID up to the greatest admitted that is not
// in the configuration was removed.
func (g *group) isRemovedReplica(r ReplicaID) bool {
	if !g.initialized() || r > g.meta.maxReplica {
		return false
	}
	_, ok := g.meta.members[r]
	return !ok
}

func (g *group) hasPending() bool {
	return len(g.proposals) > 0 || len(g.readQueue) > 0 || len(g.readsSent) > 0 ||
		len(g.confs) > 0 || len(g.joint) > 0 || len(g.quorum) > 0
}

// failPending resolves every pending request of local callers with err.
func (g *group) failPending(err error) {
	for _, k := range sortedKeys(g.proposals) {
		for _, f := range g.proposals[k].futs {
			f.resolve(Result{}, err)
		}
	}
	clear(g.proposals)
	for _, f := range g.readQueue {
		f.resolve(0, err)
	}
	g.readQueue = nil
	for _, id := range sortedKeys(g.readsSent) {
		for _, f := range g.readsSent[id].futs {
			f.resolve(0, err)
		}
	}
	clear(g.readsSent)
	for _, k := range sortedKeys(g.confs) {
		g.confs[k].resolve(Membership{}, err)
	}
	clear(g.confs)
	for _, p := range g.joint {
		p.resolve(Membership{}, err)
	}
	g.joint = nil
	for _, q := range g.quorum {
		q.fut.resolve(Result{}, err)
	}
	g.quorum = nil
	delete(g.h.busy, g.id)
}

// markRemoved retires the replica once no voter needs it (retiring.go):
// it stops ticking and answering; the application destroys it
// (DestroyGroup).
func (g *group) markRemoved() {
	g.removed = true
	g.retired.Store(true)
	delete(g.h.awake, g.id)
	g.failPending(ErrRemoved)
	g.h.peersStale = true
}

// breakWith stops a group whose state machine failed.
func (g *group) breakWith(err error) {
	if g.broken != nil {
		return
	}
	g.broken = fmt.Errorf("%w: group %d: %v", ErrGroupBroken, g.id, err)
	g.retired.Store(true)
	g.h.log.Error("raftgroup state machine failed", "group", uint64(g.id), "err", err)
	delete(g.h.awake, g.id)
	g.failPending(g.broken)
}

// restoreState installs a snapshot: the host's meta and the state
// machine's data. The log's weight starts again from it (maybeCompact).
func (g *group) restoreState(snap *pb.Snapshot) error {
	g.logBytes, g.snapBytes = 0, uint64(len(snap.GetData()))
	sd, err := decodeSnapshotData(snap.GetData())
	if err != nil {
		return err
	}
	var data []byte
	if sd.hasFSM {
		data = sd.fsm
	}
	if err := g.fsm.Restore(data); err != nil {
		return fmt.Errorf("restore state machine: %w", err)
	}
	g.meta = sd.meta
	md := snap.GetMetadata()
	g.applied = md.GetIndex()
	g.confState = proto.Clone(pb.EnsureConfState(md.GetConfState())).(*pb.ConfState)
	g.lastConfIndex = md.GetIndex()
	g.h.peersStale = true
	return nil
}

// apply is step 4 of the Ready contract for one group.
func (g *group) apply(rd *raft.Ready) {
	h := g.h
	if rd.SoftState != nil {
		if lead := ReplicaID(rd.SoftState.Lead); lead != g.leader {
			g.leader = lead
			g.leaderTick = h.tick
			g.forgetProposals()
			if lead != 0 && g.hasPending() {
				// A new leader: re-propose now rather than at the next retry.
				g.retryNow = true
				h.attention[g.id] = g
			}
		}
	}
	if g.broken != nil {
		return
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := g.restoreState(rd.Snapshot); err != nil {
			g.breakWith(err)
			return
		}
		h.appliedSome[g.id] = g
		g.confsInSnapshot()
	}
	for _, rs := range rd.ReadStates {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		if rb := g.readsSent[binary.BigEndian.Uint64(rs.RequestCtx)]; rb != nil && !rb.known {
			rb.index, rb.known = rs.Index, true
		}
	}
	if len(rd.CommittedEntries) > 0 {
		for _, e := range rd.CommittedEntries {
			g.logBytes += uint64(len(e.GetData()))
		}
		g.applyEntries(rd.CommittedEntries)
		h.appliedSome[g.id] = g
	}
	g.resolveReads()
}

// applyItem is a normal entry on its way through the state machine.
type applyItem struct {
	index uint64
	env   envelope
	d     *dedupEntry // the (first) application of the key
	fresh bool        // false: a duplicate, not applied again
}

// applyEntries applies committed entries: normal entries in runs through
// the state machine (deduplicated by key), configuration changes one by
// one through ApplyConfChange.
func (g *group) applyEntries(ents []*pb.Entry) {
	var (
		run   []Entry
		items []applyItem
		upTo  uint64 // last index handled, applied once the run is
	)
	flush := func() bool {
		var results [][]byte
		if len(run) > 0 {
			var err error
			results, err = g.fsm.Apply(run)
			if err == nil && len(results) != len(run) {
				err = fmt.Errorf("state machine returned %d results for %d entries", len(results), len(run))
			}
			if err != nil {
				g.breakWith(err)
				return false
			}
		}
		i := 0
		for _, it := range items {
			if it.fresh {
				it.d.result = results[i]
				i++
			}
		}
		g.applied = max(g.applied, upTo)
		for _, it := range items {
			g.resolveProposal(it)
		}
		run, items = run[:0], items[:0]
		return true
	}
	for _, e := range ents {
		idx := e.GetIndex()
		if idx <= g.applied {
			continue
		}
		switch e.GetType() {
		case pb.EntryNormal:
			if len(e.GetData()) == 0 {
				break // a new leader's empty entry, or a refused conf change
			}
			env, err := decodeEnvelope(e.GetData())
			if err != nil {
				g.breakWith(fmt.Errorf("entry %d: %w", idx, err))
				return
			}
			g.meta.clock = max(g.meta.clock, env.time)
			// NB: prune before every lookup, at this entry's group time, so
			// that every replica forgets keys at the same entry.
			g.meta.dedup.prune(g.meta.clock)
			if d, dup := g.meta.dedup.get(env.key); dup && env.key != "" {
				items = append(items, applyItem{index: idx, env: env, d: d})
				break
			}
			d := &dedupEntry{key: env.key, index: idx, time: g.meta.clock}
			if env.key != "" {
				g.meta.dedup.add(env.key, idx, g.meta.clock, nil)
				d, _ = g.meta.dedup.get(env.key)
			}
			run = append(run, Entry{Index: idx, Term: e.GetTerm(), Time: time.Unix(0, g.meta.clock).UTC(), Data: env.payload})
			items = append(items, applyItem{index: idx, env: env, d: d, fresh: true})
		case pb.EntryConfChange, pb.EntryConfChangeV2:
			if !flush() {
				return
			}
			g.applied = max(g.applied, upTo)
			g.applyConfChange(e)
			if g.broken != nil {
				return
			}
		}
		upTo = idx
	}
	flush()
}

// resolveProposal hands an applied (or deduplicated) entry's result to
// the local caller that proposed it, and acknowledges it to a remote
// proposer that waits for a quorum.
func (g *group) resolveProposal(it applyItem) {
	h := g.h
	if it.env.quorum && it.env.proposer != h.cfg.NodeID {
		h.queueAck(it.env.proposer, g)
	}
	p := g.proposals[it.env.key]
	if p == nil {
		return
	}
	delete(g.proposals, it.env.key)
	res := Result{Index: it.d.index, Data: it.d.result}
	if !p.quorum {
		for _, f := range p.futs {
			f.resolve(res, nil)
		}
		return
	}
	for _, f := range p.futs {
		g.quorum = append(g.quorum, &quorumWaiter{fut: f, res: res, lastQuery: h.tick})
	}
	g.checkQuorum()
}

// applyConfChange applies (or refuses, identically on every replica) a
// configuration change entry.
func (g *group) applyConfChange(e *pb.Entry) {
	var cc *pb.ConfChangeV2
	switch e.GetType() {
	case pb.EntryConfChange:
		v1 := &pb.ConfChange{}
		if err := proto.Unmarshal(e.GetData(), v1); err != nil {
			g.breakWith(fmt.Errorf("conf change %d: %w", e.GetIndex(), err))
			return
		}
		cc = v1.AsV2()
	default:
		cc = &pb.ConfChangeV2{}
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			g.breakWith(fmt.Errorf("conf change %d: %w", e.GetIndex(), err))
			return
		}
	}
	ctx, err := decodeConfContext(cc.GetContext())
	if err != nil {
		g.breakWith(fmt.Errorf("conf change %d: %w", e.GetIndex(), err))
		return
	}
	g.meta.dedup.prune(g.meta.clock)
	if _, dup := g.meta.dedup.get(ctx.key); dup && ctx.key != "" {
		// A retry of a change already applied: refuse it (no
		// ApplyConfChange call). Its first application resolved the caller,
		// unless this replica got it in a snapshot.
		g.applied = e.GetIndex()
		g.confApplied(ctx.key)
		return
	}
	if refuse := g.checkConfChange(cc, ctx); refuse != nil {
		g.applied = e.GetIndex()
		if p := g.confs[ctx.key]; p != nil {
			delete(g.confs, ctx.key)
			p.resolve(Membership{}, refuse)
		}
		g.h.log.Info("configuration change refused", "group", uint64(g.id), "index", e.GetIndex(), "err", refuse)
		return
	}
	cs := g.rn.ApplyConfChange(cc)
	added := map[ReplicaID]NodeID{}
	for _, m := range ctx.nodes {
		added[m.Replica] = m.Node
	}
	members := map[ReplicaID]NodeID{}
	for _, id := range confIDs(cs) {
		r := ReplicaID(id)
		if n, ok := g.meta.members[r]; ok {
			members[r] = n
		} else {
			members[r] = added[r]
		}
		g.meta.maxReplica = max(g.meta.maxReplica, r)
	}
	g.meta.members = members
	for r := range g.learned {
		if _, ok := members[r]; ok {
			delete(g.learned, r)
		}
	}
	if ctx.key != "" {
		g.meta.dedup.add(ctx.key, e.GetIndex(), g.meta.clock, nil)
	}
	g.confState = cs
	g.lastConfIndex = e.GetIndex()
	g.applied = e.GetIndex()
	g.h.peersStale = true
	g.h.log.Info("configuration changed", "group", uint64(g.id), "index", e.GetIndex(), "conf", raft.DescribeConfState(cs))
	g.confApplied(ctx.key)
	g.checkMembership()
}

// checkConfChange decides deterministically whether a committed change
// may be applied: replica IDs are never reused, added replicas have a
// node, and Raft's own rules hold (checked on a scratch tracker, since
// ApplyConfChange panics on a change it refuses).
func (g *group) checkConfChange(cc *pb.ConfChangeV2, ctx confContext) error {
	nodes := map[ReplicaID]NodeID{}
	for _, m := range ctx.nodes {
		if m.Node != 0 {
			nodes[m.Replica] = m.Node
		}
	}
	for _, c := range cc.GetChanges() {
		r := ReplicaID(c.GetNodeId())
		switch c.GetType() {
		case pb.ConfChangeAddNode, pb.ConfChangeAddLearnerNode:
			if n, member := g.meta.members[r]; member {
				// Adding a member again is a promotion or a demotion at most.
				// A voter added as a voter beside the removal of another
				// member, or a member "added" on another node, is a change
				// decided on a stale view (the same NextReplicaID handed out
				// twice while the first change was in flight): applied, its
				// removal would go through and its addition would not,
				// shrinking the group. (A retry of a replacement that already
				// happened adds a voter and removes a non-member: a no-op.)
				if c.GetType() == pb.ConfChangeAddNode && slices.Contains(g.confState.GetVoters(), uint64(r)) && g.removesMember(cc) {
					return fmt.Errorf("%w: replica %d is a voter already", ErrReplicaIDReused, r)
				}
				if m, ok := nodes[r]; ok && m != n {
					return fmt.Errorf("%w: replica %d is on node %d, not %d", ErrReplicaIDReused, r, n, m)
				}
				continue
			}
			if r <= g.meta.maxReplica {
				return fmt.Errorf("%w: replica %d", ErrReplicaIDReused, r)
			}
			if _, ok := nodes[r]; !ok {
				return fmt.Errorf("%w: no node for replica %d", ErrInvalidChange, r)
			}
		}
	}
	if err := validateConfChange(g.confState, cc); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidChange, err)
	}
	return nil
}

// removesMember reports whether cc removes a current member.
func (g *group) removesMember(cc *pb.ConfChangeV2) bool {
	for _, c := range cc.GetChanges() {
		if c.GetType() == pb.ConfChangeRemoveNode {
			if _, member := g.meta.members[ReplicaID(c.GetNodeId())]; member {
				return true
			}
		}
	}
	return false
}

// validateConfChange runs cc against cs on a scratch tracker.
func validateConfChange(cs *pb.ConfState, cc *pb.ConfChangeV2) error {
	chg := confchange.Changer{Tracker: tracker.MakeProgressTracker(1, 0), LastIndex: 1}
	cfg, prs, err := confchange.Restore(chg, cs)
	if err != nil {
		return err
	}
	chg.Tracker.Config, chg.Tracker.Progress = cfg, prs
	if cc.LeaveJoint() {
		_, _, err = chg.LeaveJoint()
	} else if autoLeave, ok := cc.EnterJoint(); ok {
		_, _, err = chg.EnterJoint(autoLeave, cc.GetChanges()...)
	} else {
		_, _, err = chg.Simple(cc.GetChanges()...)
	}
	return err
}

// confIDs lists every replica of a configuration.
func confIDs(cs *pb.ConfState) []uint64 {
	var ids []uint64
	for _, set := range [][]uint64{cs.GetVoters(), cs.GetLearners(), cs.GetVotersOutgoing(), cs.GetLearnersNext()} {
		for _, id := range set {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

func isJoint(cs *pb.ConfState) bool { return len(cs.GetVotersOutgoing()) > 0 }

// confApplied resolves this replica's change of key, applied: once the
// group is out of the joint configuration (resolveJoint).
func (g *group) confApplied(key string) {
	if p := g.confs[key]; p != nil {
		delete(g.confs, key)
		g.joint = append(g.joint, p)
	}
	g.resolveJoint()
}

// confsInSnapshot resolves the changes proposed here that a snapshot just
// installed shows applied (their keys are in its deduplication table):
// their entries will not be applied here, and a retry would be refused
// as a duplicate.
func (g *group) confsInSnapshot() {
	for _, k := range sortedKeys(g.confs) {
		if _, dup := g.meta.dedup.get(k); dup {
			g.confApplied(k)
		}
	}
	g.resolveJoint()
}

// resolveJoint resolves membership changes that were applied once the
// group is out of any joint configuration.
func (g *group) resolveJoint() {
	if isJoint(g.confState) || len(g.joint) == 0 {
		return
	}
	m := g.membership()
	for _, p := range g.joint {
		p.resolve(m, nil)
	}
	g.joint = nil
}

// membership describes the current configuration.
func (g *group) membership() Membership {
	m := Membership{Index: g.lastConfIndex}
	for _, id := range g.confState.GetVoters() {
		m.Voters = append(m.Voters, Member{Replica: ReplicaID(id), Node: g.meta.members[ReplicaID(id)]})
	}
	for _, id := range g.confState.GetLearners() {
		m.Learners = append(m.Learners, Member{Replica: ReplicaID(id), Node: g.meta.members[ReplicaID(id)]})
	}
	return m
}

// snapshotForSend is raft.Storage.Snapshot: the stored snapshot if it
// covers the current configuration (a replica being added must find
// itself in it), else a fresh one of the state machine.
func (g *group) snapshotForSend() (*pb.Snapshot, error) {
	if s := g.st.snap; s != nil && s.GetIndex() >= g.lastConfIndex && s.GetIndex() >= g.st.trunc.index {
		snap, err := g.st.loadSnapshot()
		if err == nil && snap != nil {
			return snap, nil
		}
	}
	snap, err := g.takeSnapshot()
	if err != nil {
		g.h.log.Warn("snapshot for a follower failed", "group", uint64(g.id), "err", err)
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	return snap, nil
}

// snapshotData encodes the group's meta and its state machine's snapshot.
func (g *group) snapshotData() ([]byte, error) {
	sd := snapshotData{meta: g.meta, hasFSM: true}
	if a, ok := g.fsm.(SnapshotAppender); ok {
		return a.AppendSnapshot(sd.header())
	}
	data, err := g.fsm.Snapshot()
	if err != nil {
		return nil, err
	}
	sd.fsm = data
	return sd.encode(), nil
}

// takeSnapshot snapshots the state machine at the applied index and
// stores it as the group's latest snapshot.
func (g *group) takeSnapshot() (*pb.Snapshot, error) {
	if g.broken != nil {
		return nil, g.broken
	}
	if g.applied == 0 {
		return nil, errors.New("nothing applied")
	}
	if s := g.st.snap; s != nil && s.GetIndex() >= g.applied {
		return g.st.loadSnapshot()
	}
	term, err := g.st.Term(g.applied)
	if err != nil {
		return nil, err
	}
	data, err := g.snapshotData()
	if err != nil {
		return nil, err
	}
	snap := &pb.Snapshot{Data: data, Metadata: g.snapshotMeta(term)}
	err = g.storeStaged(func(b *pebble.Batch) (func(), error) { return g.st.stageSnapshot(b, snap) })
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// snapshotMeta is the metadata of a snapshot at the applied index.
func (g *group) snapshotMeta(term uint64) *pb.SnapshotMetadata {
	return &pb.SnapshotMetadata{
		Index:     new(g.applied),
		Term:      new(term),
		ConfState: proto.Clone(g.confState).(*pb.ConfState),
	}
}

// storeStaged writes a snapshot that stage adds to a batch and makes it
// the group's latest.
func (g *group) storeStaged(stage func(*pebble.Batch) (func(), error)) error {
	b := g.h.db.NewBatch()
	defer b.Close()
	commit, err := stage(b)
	if err != nil {
		return err
	}
	if err := g.h.commit(b, false); err != nil {
		return err
	}
	commit()
	g.h.stats.SnapshotsTaken++
	return nil
}

// storeSnapshot stores a snapshot of the state machine at the applied
// index, as takeSnapshot does, and returns its size. A SnapshotWriter's
// large snapshot is written straight into the journal (see
// SnapshotWriter): log compaction then never holds a whole copy of the
// state in memory.
func (g *group) storeSnapshot() (uint64, error) {
	taken := func() (uint64, error) {
		snap, err := g.takeSnapshot()
		return uint64(len(snap.GetData())), err
	}
	sw, ok := g.fsm.(SnapshotWriter)
	if !ok || !g.streamable() {
		return taken()
	}
	term, sd, err := g.snapshotHeader()
	if err != nil {
		return 0, err
	}
	hdr := sd.header()
	write := func(w io.Writer) error {
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		return sw.WriteSnapshot(w)
	}
	var sum checksumWriter
	if err := write(&sum); err != nil {
		return 0, err
	}
	if sum.n < g.st.large {
		return taken() // small: kept in Pebble
	}
	meta := g.snapshotMeta(term)
	err = g.storeStaged(func(b *pebble.Batch) (func(), error) {
		return g.st.stageSnapshotStream(b, meta, sum.n, sum.crc, write)
	})
	if err != nil {
		return 0, err
	}
	return uint64(sum.n), nil
}

// streamable reports whether a snapshot of the state machine may be
// written as a stream into a journal blob or a file of its own: the
// journal takes large data, there is something new to snapshot, and the
// group is sound.
func (g *group) streamable() bool {
	covered := g.st.snap != nil && g.st.snap.GetIndex() >= g.applied
	return g.st.large > 0 && !covered && g.broken == nil && g.applied > 0
}

// snapshotHeader returns the term of the applied index and the part of a
// snapshot up to the state machine's (the host's meta as of now, frozen:
// its header may be encoded off the loop).
func (g *group) snapshotHeader() (uint64, *snapshotData, error) {
	term, err := g.st.Term(g.applied)
	if err != nil {
		return 0, nil, err
	}
	return term, &snapshotData{meta: g.meta.frozen(), hasFSM: true}, nil
}

// checksumWriter counts and checksums what is written to it.
type checksumWriter struct {
	n   int
	crc uint32
}

func (c *checksumWriter) Write(p []byte) (int, error) {
	c.crc = crc32.Update(c.crc, crcTable, p)
	c.n += len(p)
	return len(p), nil
}

// maybeCompact snapshots and truncates the log once enough entries were
// applied since the last snapshot, or enough bytes: large entries (file
// data) would otherwise keep gigabytes of log (10,000 entries of 1 MiB)
// while the state is a fraction of it. Both thresholds grow with the
// snapshot so that snapshotting a large state stays a bounded share of
// the writes: the count only counts once the log weighs as much as the
// last snapshot (entryWeight an entry beside its data), so that a volume
// of 512 MiB is not written out again after every 10,000 small writes
// (40 MiB of 4 KiB ones).
func (g *group) maybeCompact() error {
	if g.bgSnap != nil {
		return nil // one is being written off the loop
	}
	var since uint64
	if s := g.st.snap; s != nil {
		since = s.GetIndex()
	}
	byBytes := g.logBytes >= max(g.h.cfg.SnapshotBytes, 4*g.snapBytes)
	n := g.applied - min(since, g.applied)
	byEntries := n >= g.h.cfg.SnapshotEntries && g.logBytes+n*entryWeight >= g.snapBytes
	if !byEntries && !byBytes {
		return nil
	}
	// The log keeps CompactionMargin entries before the snapshot for slow
	// followers, or, for a snapshot taken for the bytes, half of what it
	// covers since the last one, not a count of entries.
	margin := g.h.cfg.CompactionMargin
	if byBytes {
		margin = min(margin, (g.applied-since)/2)
	}
	return g.snapshotAndCompact(margin)
}

// snapshotAndCompact snapshots the state machine at its applied index,
// off the loop if it can (adoptBackgroundSnapshot compacts once the
// snapshot is written), else here, and truncates the log up to margin
// entries before the snapshot (compactTo).
func (g *group) snapshotAndCompact(margin uint64) error {
	if started, err := g.startBackgroundSnapshot(margin); started || err != nil {
		return err
	}
	size, err := g.storeSnapshot()
	if err != nil {
		return err
	}
	g.logBytes, g.snapBytes = 0, size
	return g.compactTo(g.st.snap.GetIndex(), margin)
}

// compactTo truncates the log after storing a snapshot at idx, keeping
// margin entries before it.
func (g *group) compactTo(idx, margin uint64) error {
	if idx <= margin {
		return nil
	}
	return g.truncateLog(idx - margin)
}

// truncateLog drops the log's entries up to index to (at most the stored
// snapshot's index).
func (g *group) truncateLog(to uint64) error {
	if to <= g.st.trunc.index {
		return nil
	}
	b := g.h.db.NewBatch()
	defer b.Close()
	commit, err := g.st.stageCompact(b, to)
	if err != nil {
		return err
	}
	if err := g.h.commit(b, false); err != nil {
		return err
	}
	commit()
	return nil
}

// entryWeight is what an entry counts for in the log's weight beside its
// data, against the size of a snapshot (maybeCompact): its keys and
// framing in the journal and Pebble, and its apply again after a restart.
const entryWeight = 1 << 10

// recordAck notes a replica's applied index (reported for quorum waits).
func (g *group) recordAck(r ReplicaID, applied uint64) {
	if applied > g.peerApplied[r] {
		g.peerApplied[r] = applied
	}
	g.checkQuorum()
}

// checkQuorum resolves the proposals a quorum of voters has applied.
func (g *group) checkQuorum() {
	if len(g.quorum) == 0 {
		return
	}
	keep := g.quorum[:0]
	for _, q := range g.quorum {
		if g.quorumApplied(q.res.Index) {
			q.fut.resolve(q.res, nil)
			continue
		}
		keep = append(keep, q)
	}
	clear(g.quorum[len(keep):])
	g.quorum = keep
}

func (g *group) quorumApplied(index uint64) bool {
	ok := func(ids []uint64) bool {
		if len(ids) == 0 {
			return true
		}
		n := 0
		for _, id := range ids {
			r := ReplicaID(id)
			if (r == g.replica && g.applied >= index) || (r != g.replica && g.peerApplied[r] >= index) {
				n++
			}
		}
		return n > len(ids)/2
	}
	return ok(g.confState.GetVoters()) && ok(g.confState.GetVotersOutgoing())
}
