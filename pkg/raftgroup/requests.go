package raftgroup

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// pendingProposal is a local caller's proposal until it is applied. The
// host re-proposes the same bytes (same key) until then: Raft drops
// proposals silently (no leader, a lost forward, a leader change), and the
// key makes the retries harmless.
type pendingProposal struct {
	key     string
	data    []byte
	futs    []*Future[Result]
	quorum  bool
	lastTry uint64
	leader  ReplicaID // the leader known at the last try
}

// readBatch is the reads that share one ReadIndex request.
type readBatch struct {
	futs   []*Future[uint64]
	index  uint64
	known  bool
	sentAt uint64
	leader ReplicaID
}

// pendingConf is a local caller's membership change.
type pendingConf struct {
	key     string
	cc      *pb.ConfChangeV2
	futs    []*Future[Membership]
	lastTry uint64
	leader  ReplicaID
}

func (p *pendingConf) resolve(m Membership, err error) {
	for _, f := range p.futs {
		f.resolve(m, err)
	}
}

// quorumWaiter is an applied proposal waiting for a quorum of voters to
// report they applied it too.
type quorumWaiter struct {
	fut       *Future[Result]
	res       Result
	lastQuery uint64
}

// Membership is a group's configuration.
type Membership struct {
	// Index is the log index of the configuration change that made it.
	Index    uint64
	Voters   []Member
	Learners []Member
}

// liveGroup returns a group that accepts requests.
func (h *Host) liveGroup(id GroupID) (*group, error) {
	if h.err != nil {
		return nil, h.err
	}
	g := h.groups[id]
	switch {
	case g == nil:
		return nil, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	case g.removed || g.retiring != nil:
		return nil, ErrRemoved
	case g.broken != nil:
		return nil, g.broken
	}
	return g, nil
}

// Propose proposes data to group id and waits until this replica applied
// it: it returns the entry's index and the state machine's result.
func (h *Host) Propose(ctx context.Context, id GroupID, data []byte) (uint64, []byte, error) {
	r, err := h.Submit(id, Proposal{Data: data}).Wait(ctx)
	return r.Index, r.Data, err
}

// Submit proposes p to group id. The future resolves once this replica
// applied it (with p.WaitQuorum: once a quorum of voters did).
func (h *Host) Submit(id GroupID, p Proposal) *Future[Result] {
	fut := newFuture[Result]()
	now := h.cfg.Now().UnixNano()
	h.enqueue(request{
		run:  func() { h.startProposal(id, p, now, fut) },
		fail: func(err error) { fut.resolve(Result{}, err) },
	})
	return fut
}

func (h *Host) startProposal(id GroupID, p Proposal, now int64, fut *Future[Result]) {
	if fut.isResolved() {
		return
	}
	g, err := h.liveGroup(id)
	if err != nil {
		fut.resolve(Result{}, err)
		return
	}
	key := p.Key
	if key == "" {
		key = h.newKey()
	}
	if pp := g.proposals[key]; pp != nil {
		pp.futs = append(pp.futs, fut)
		pp.quorum = pp.quorum || p.WaitQuorum
		return
	}
	env := envelope{key: key, time: now, proposer: h.cfg.NodeID, quorum: p.WaitQuorum, payload: p.Data}
	pp := &pendingProposal{key: key, data: env.encode(), futs: []*Future[Result]{fut}, quorum: p.WaitQuorum}
	g.proposals[key] = pp
	h.busy[g.id] = g
	h.wakeGroup(g)
	g.propose(pp)
}

func (g *group) propose(pp *pendingProposal) {
	pp.lastTry, pp.leader = g.h.tick, g.leader
	g.countProposals(g.replica, 1, len(pp.data))
	if err := g.rn.Propose(pp.data); err != nil && !errors.Is(err, raft.ErrProposalDropped) {
		g.h.log.Debug("propose failed", "group", uint64(g.id), "err", err)
	}
	g.h.markDirty(g)
}

// ReadIndex waits until this replica has applied everything committed
// before the call (a linearizable read point): once it returns, reading
// the local state machine is linearizable. It returns the read index.
func (h *Host) ReadIndex(ctx context.Context, id GroupID) (uint64, error) {
	return h.ReadIndexAsync(id).Wait(ctx)
}

// ReadIndexAsync is ReadIndex's asynchronous form.
func (h *Host) ReadIndexAsync(id GroupID) *Future[uint64] {
	fut := newFuture[uint64]()
	h.enqueue(request{
		run: func() {
			if fut.isResolved() {
				return
			}
			g, err := h.liveGroup(id)
			if err != nil {
				fut.resolve(0, err)
				return
			}
			g.readQueue = append(g.readQueue, fut)
			h.busy[g.id] = g
			h.wakeGroup(g)
			g.issueReads()
		},
		fail: func(err error) { fut.resolve(0, err) },
	})
	return fut
}

// issueReads sends one ReadIndex for every read queued so far (reads that
// arrive later in the round join it: the leader handles it after they
// arrived).
func (g *group) issueReads() {
	if len(g.readQueue) == 0 {
		return
	}
	h := g.h
	h.nextReadID++
	id := h.nextReadID
	g.readsSent[id] = &readBatch{futs: g.readQueue, sentAt: h.tick, leader: g.leader}
	g.readQueue = nil
	g.rn.ReadIndex(binary.BigEndian.AppendUint64(nil, id))
	h.markDirty(g)
}

// resolveReads completes the reads whose read index is applied.
func (g *group) resolveReads() {
	for _, id := range sortedKeys(g.readsSent) {
		rb := g.readsSent[id]
		if !rb.known || rb.index > g.applied {
			continue
		}
		for _, f := range rb.futs {
			f.resolve(rb.index, nil)
		}
		delete(g.readsSent, id)
	}
}

// ChangeMembership changes the group's configuration and waits until this
// replica applied it (and, for several changes at once, until the group
// left the joint configuration). Added replicas must have a replica ID
// the group never used (NextReplicaID) and should exist on their node
// (JoinGroup) — they catch up by snapshot.
func (h *Host) ChangeMembership(ctx context.Context, id GroupID, changes ...Change) (Membership, error) {
	return h.ChangeMembershipAsync(id, changes...).Wait(ctx)
}

// ChangeMembershipAsync is ChangeMembership's asynchronous form.
func (h *Host) ChangeMembershipAsync(id GroupID, changes ...Change) *Future[Membership] {
	fut := newFuture[Membership]()
	changes = slices.Clone(changes)
	h.enqueue(request{
		run:  func() { h.startConfChange(id, changes, fut) },
		fail: func(err error) { fut.resolve(Membership{}, err) },
	})
	return fut
}

func (h *Host) startConfChange(id GroupID, changes []Change, fut *Future[Membership]) {
	if fut.isResolved() {
		return
	}
	g, err := h.liveGroup(id)
	if err != nil {
		fut.resolve(Membership{}, err)
		return
	}
	if len(changes) == 0 {
		fut.resolve(Membership{}, fmt.Errorf("%w: no change", ErrInvalidChange))
		return
	}
	key := h.newKey()
	cc := &pb.ConfChangeV2{}
	ctx := confContext{key: key, proposer: h.cfg.NodeID}
	for _, c := range changes {
		var t pb.ConfChangeType
		switch c.Type {
		case AddVoter:
			t = pb.ConfChangeAddNode
		case AddLearner:
			t = pb.ConfChangeAddLearnerNode
		case RemoveReplica:
			t = pb.ConfChangeRemoveNode
		default:
			fut.resolve(Membership{}, fmt.Errorf("%w: %v", ErrInvalidChange, c.Type))
			return
		}
		if c.Replica == 0 {
			fut.resolve(Membership{}, fmt.Errorf("%w: replica 0", ErrInvalidChange))
			return
		}
		if c.Type != RemoveReplica {
			if c.Node == 0 {
				if n, ok := g.meta.members[c.Replica]; ok {
					c.Node = n
				} else {
					fut.resolve(Membership{}, fmt.Errorf("%w: replica %d needs a node", ErrInvalidChange, c.Replica))
					return
				}
			}
			ctx.nodes = append(ctx.nodes, Member{Replica: c.Replica, Node: c.Node})
		}
		cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: t.Enum(), NodeId: new(uint64(c.Replica))})
	}
	cc.Context = ctx.encode()
	// Check against what this replica knows now; the authoritative check
	// runs when the change is applied.
	if err := g.checkConfChange(cc, ctx); err != nil {
		fut.resolve(Membership{}, err)
		return
	}
	p := &pendingConf{key: key, cc: cc, futs: []*Future[Membership]{fut}}
	g.confs[key] = p
	h.busy[g.id] = g
	h.wakeGroup(g)
	g.proposeConf(p)
}

func (g *group) proposeConf(p *pendingConf) {
	p.lastTry, p.leader = g.h.tick, g.leader
	if err := g.rn.ProposeConfChange(p.cc); err != nil && !errors.Is(err, raft.ErrProposalDropped) {
		g.h.log.Debug("propose conf change failed", "group", uint64(g.id), "err", err)
	}
	g.h.markDirty(g)
}

// Campaign makes this replica of group id campaign for leadership (after
// a pre-vote). Useful right after creating a group.
func (h *Host) Campaign(id GroupID) {
	h.enqueue(request{run: func() {
		if g, err := h.liveGroup(id); err == nil {
			h.wakeGroup(g)
			_ = g.rn.Campaign()
			h.markDirty(g)
		}
	}})
}

// TransferLeadership asks the leader of group id (if it is this replica)
// to hand leadership to replica to.
func (h *Host) TransferLeadership(id GroupID, to ReplicaID) {
	h.enqueue(request{run: func() {
		if g, err := h.liveGroup(id); err == nil {
			h.wakeGroup(g)
			g.rn.TransferLeader(uint64(to))
			h.markDirty(g)
		}
	}})
}

// retry re-proposes what waited long enough for an outcome (or, with
// leaderChanged, what was tried under another leader).
func (g *group) retry(leaderChanged bool) {
	h := g.h
	due := func(last uint64, leader ReplicaID) bool {
		return (leaderChanged && leader != g.leader) || h.tick-last >= uint64(h.cfg.RetryTicks)
	}
	for _, k := range sortedKeys(g.proposals) {
		p := g.proposals[k]
		p.futs = slices.DeleteFunc(p.futs, (*Future[Result]).isResolved)
		if len(p.futs) == 0 {
			delete(g.proposals, k)
			continue
		}
		if due(p.lastTry, p.leader) {
			h.stats.ProposalRetries++
			g.propose(p)
		}
	}
	g.readQueue = slices.DeleteFunc(g.readQueue, (*Future[uint64]).isResolved)
	for _, id := range sortedKeys(g.readsSent) {
		rb := g.readsSent[id]
		rb.futs = slices.DeleteFunc(rb.futs, (*Future[uint64]).isResolved)
		if len(rb.futs) == 0 {
			delete(g.readsSent, id)
			continue
		}
		if !rb.known && due(rb.sentAt, rb.leader) {
			delete(g.readsSent, id)
			g.readQueue = append(g.readQueue, rb.futs...)
		}
	}
	g.issueReads()
	for _, k := range sortedKeys(g.confs) {
		p := g.confs[k]
		p.futs = slices.DeleteFunc(p.futs, (*Future[Membership]).isResolved)
		if len(p.futs) == 0 {
			delete(g.confs, k)
			continue
		}
		if due(p.lastTry, p.leader) {
			g.proposeConf(p)
		}
	}
	g.quorum = slices.DeleteFunc(g.quorum, func(q *quorumWaiter) bool { return q.fut.isResolved() })
	queried := false
	for _, q := range g.quorum {
		if h.tick-q.lastQuery < uint64(h.cfg.RetryTicks) {
			continue
		}
		q.lastQuery = h.tick
		if !queried {
			queried = true
			for _, r := range sortedKeys(g.meta.members) {
				if n := g.meta.members[r]; r != g.replica && n != h.cfg.NodeID {
					b := h.outbox(n)
					if !slices.Contains(b.AckQueries, g.id) {
						b.AckQueries = append(b.AckQueries, g.id)
					}
				}
			}
		}
	}
}

func (f *Future[T]) isResolved() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resolved
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// GroupStatus describes this host's replica of a group.
type GroupStatus struct {
	Group   GroupID
	Replica ReplicaID
	// Role is leader, follower, candidate or pre-candidate.
	Role       string
	Leader     ReplicaID
	LeaderNode NodeID
	Term       uint64
	Commit     uint64
	Applied    uint64
	// FirstIndex and LastIndex bound the stored log; SnapshotIndex is the
	// latest stored snapshot's.
	FirstIndex    uint64
	LastIndex     uint64
	SnapshotIndex uint64
	Voters        []Member
	Learners      []Member
	// VotersOutgoing is non-empty in a joint configuration.
	VotersOutgoing []Member
	// MaxReplica is the greatest replica ID the group ever admitted.
	MaxReplica ReplicaID
	// Clock is the group clock (the greatest proposer time applied).
	Clock    time.Time
	Quiesced bool
	Removed  bool
	// Retiring: the group removed this replica, but a voter may still
	// need its vote; it takes no requests (retiring.go). Removed follows.
	Retiring    bool
	Initialized bool
	// Progress of every replica, on the leader only.
	Progress map[ReplicaID]ReplicaProgress
	Err      error
}

// ReplicaProgress is the leader's view of a replica.
type ReplicaProgress struct {
	Match   uint64
	Next    uint64
	State   string
	Learner bool
	// Applied is the replica's applied index as last reported (for quorum
	// waits), zero if never.
	Applied uint64
}

// Status describes this host's replica of group id.
func (h *Host) Status(id GroupID) (GroupStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[id]
	if g == nil {
		return GroupStatus{}, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	}
	return g.status(), nil
}

// Serves reports whether this host's replica of group id takes requests:
// it exists, holds the group's state (a snapshot) and was neither removed
// nor broken — Status's Initialized, !Removed and Err == nil. Unlike
// Status it never waits for the loop, which holds the host's lock through
// a whole round, journal sync included: a caller deciding where to send
// each filesystem op waited there for the round before, so concurrent
// writers' proposals reached the loop one round apart and no two shared
// a sync.
func (h *Host) Serves(id GroupID) bool {
	v, ok := h.index.Load(id)
	if !ok {
		return false
	}
	g := v.(*group)
	return g.st.hasSnap.Load() && !g.retired.Load()
}

// Brief is the part of a group's status that periodic sweeps over every
// group need, without the cost of Status (member lists, progress maps).
type Brief struct {
	Replica  ReplicaID
	Leader   bool // this replica leads the group
	Removed  bool // the group removed this replica
	Retiring bool // the group removed this replica, which may still be needed for a vote
}

// Brief returns id's Brief.
func (h *Host) Brief(id GroupID) (Brief, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[id]
	if g == nil {
		return Brief{}, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	}
	return Brief{
		Replica:  g.replica,
		Leader:   g.rn.BasicStatus().RaftState == raft.StateLeader,
		Removed:  g.removed,
		Retiring: g.retiring != nil,
	}, nil
}

func (g *group) status() GroupStatus {
	bs := g.rn.BasicStatus()
	s := GroupStatus{
		Group:       g.id,
		Replica:     g.replica,
		Role:        roleName(bs.RaftState),
		Leader:      ReplicaID(bs.Lead),
		Term:        bs.GetTerm(),
		Commit:      bs.GetCommit(),
		Applied:     g.applied,
		FirstIndex:  g.st.trunc.index + 1,
		LastIndex:   g.st.last,
		MaxReplica:  g.meta.maxReplica,
		Clock:       time.Unix(0, g.meta.clock).UTC(),
		Quiesced:    g.quiesced,
		Removed:     g.removed,
		Retiring:    g.retiring != nil,
		Initialized: g.initialized(),
		Err:         g.broken,
	}
	if g.st.snap != nil {
		s.SnapshotIndex = g.st.snap.GetIndex()
	}
	if s.Leader != 0 {
		s.LeaderNode, _ = g.nodeOf(s.Leader)
	}
	member := func(id uint64) Member { return Member{Replica: ReplicaID(id), Node: g.meta.members[ReplicaID(id)]} }
	for _, id := range g.confState.GetVoters() {
		s.Voters = append(s.Voters, member(id))
	}
	for _, id := range g.confState.GetLearners() {
		s.Learners = append(s.Learners, member(id))
	}
	for _, id := range g.confState.GetVotersOutgoing() {
		s.VotersOutgoing = append(s.VotersOutgoing, member(id))
	}
	if bs.RaftState == raft.StateLeader {
		s.Progress = map[ReplicaID]ReplicaProgress{}
		g.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
			s.Progress[ReplicaID(id)] = ReplicaProgress{
				Match:   pr.Match,
				Next:    pr.Next,
				State:   pr.State.String(),
				Learner: typ == raft.ProgressTypeLearner,
				Applied: g.peerApplied[ReplicaID(id)],
			}
		})
	}
	return s
}

func roleName(s raft.StateType) string {
	switch s {
	case raft.StateLeader:
		return "leader"
	case raft.StateFollower:
		return "follower"
	case raft.StateCandidate:
		return "candidate"
	case raft.StatePreCandidate:
		return "pre-candidate"
	}
	return s.String()
}

// Groups lists the groups this host holds a replica of.
func (h *Host) Groups() []GroupID {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sortedGroups(h.groups)
}

// NextReplicaID returns a replica ID group id has never used, as far as
// this replica knows (ask the leader; a stale answer is refused when the
// change applies, and the caller retries).
func (h *Host) NextReplicaID(id GroupID) (ReplicaID, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[id]
	if g == nil {
		return 0, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	}
	return g.meta.maxReplica + 1, nil
}

// WithStateMachine runs fn with group id's state machine on the loop (no
// entry is applied meanwhile): a consistent local read without the state
// machine's own locking. fn must be quick.
func (h *Host) WithStateMachine(id GroupID, fn func(sm StateMachine, applied uint64)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[id]
	if g == nil {
		return fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	}
	fn(g.fsm, g.applied)
	return nil
}

// Machine returns group id's state machine without waiting for the loop,
// for a state machine that guards itself against the loop applying
// entries meanwhile (volfs.FS): a read through WithStateMachine waits for
// the round in progress, journal sync included.
func (h *Host) Machine(id GroupID) (StateMachine, error) {
	v, ok := h.index.Load(id)
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	}
	return v.(*group).fsm, nil
}

// PeerSilence returns, for every node this host shares a group with, how
// long it has received nothing from that node's host, in whole ticks of
// TickInterval. Every host pings the others it shares groups with a few
// times per election timeout, quiesced or not, so a silence much longer
// than that means the peer's process is down or cut off, whatever the
// cluster's membership says of its node (vold replaces a replica whose
// vold stays silent, not only one whose node is dead). A peer first
// known after this host started counts from then.
func (h *Host) PeerSilence() map[NodeID]time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.peersStale {
		h.recomputePeers()
	}
	out := make(map[NodeID]time.Duration, len(h.peers))
	for n, p := range h.peers {
		out[n] = time.Duration(h.tick-p.lastHeard) * h.cfg.TickInterval
	}
	return out
}

// Check reports whether the host works: it returns once a round of the
// loop has written and synced a journal record. A process that answers
// its peers may still have a loop stuck on a lock, or a disk that no
// longer completes a sync; such a host does not return before ctx ends,
// and a failed one returns its error.
func (h *Host) Check(ctx context.Context) error {
	_, err := h.CheckAsync().Wait(ctx)
	return err
}

// CheckAsync is Check's asynchronous form.
func (h *Host) CheckAsync() *Future[struct{}] {
	fut := newFuture[struct{}]()
	h.enqueue(request{
		run: func() {
			if fut.isResolved() {
				return
			}
			if h.err != nil {
				fut.resolve(struct{}{}, h.err)
				return
			}
			// An empty batch still writes a record (its sequence number)
			// and syncs it: the sync is what a stuck disk would not finish.
			b := h.db.NewBatch()
			defer b.Close()
			if err := h.commit(b, true); err != nil {
				h.fail(fmt.Errorf("check: %w", err))
				fut.resolve(struct{}{}, h.err)
				return
			}
			fut.resolve(struct{}{}, nil)
		},
		fail: func(err error) { fut.resolve(struct{}{}, err) },
	})
	return fut
}
