package raftgroup

// A replica that learns the group removed it does not fall silent at once.
// etcd raft switches a replica's configuration when it applies a change,
// and a leader's commit reaches its followers a message later: so a
// member that has not heard that the change committed still runs the
// configuration before it (joint, or the old one), and that
// configuration may need the removed replica's vote. If the leader dies
// then, and the removed replica has gone, no one can ever be elected
// (TestRemovedReplicaVotesUntilNoVoterNeedsIt; etcd-io/etcd#12359
// describes the same hole).
//
// So the removed replica stays a Raft peer — it votes, and campaigns if
// its own configuration still counts it a voter — but takes no requests
// (ErrRemoved, Serves false), until every voter of the newest
// configuration it heard of has said that it counts it removed. A voter
// that says so has applied a configuration without it, and a replica's
// applied configuration only moves forward (a commit index covering a
// change is synced before the change is applied), so no voter of that
// configuration ever needs its vote again. Only then is the replica
// Removed, and the application may destroy it.
//
// Voting after its removal is what etcd raft already lets any replica do
// (a candidate counts only the votes of its own configuration's voters,
// and learners vote too: etcd-io/etcd#10998). It asks with RetireQueries
// every pingTicks; members answer those, and any message from a replica
// they count removed, with a RemovedNotice naming their configuration.
// A voter that is dead keeps it waiting until the group replaces that
// voter too: a notice from the configuration after that names the new
// voters.

// retirement is the state of a replica that knows it was removed.
type retirement struct {
	conf      uint64               // index of the newest configuration heard of without this replica
	voters    map[ReplicaID]NodeID // that configuration's voters
	confirmed map[ReplicaID]bool   // replicas that said they count this one removed
	asked     uint64               // host tick of the last queries
}

// learnRemoved records that the configuration made at conf, whose voters
// are voters, does not have this replica; from, if not zero, is the
// replica that said so. It retires the replica once every voter of the
// newest such configuration said so.
func (g *group) learnRemoved(conf uint64, voters []Member, from ReplicaID) {
	if g.removed || g.broken != nil {
		return
	}
	h := g.h
	if g.retiring == nil {
		g.retiring = &retirement{confirmed: map[ReplicaID]bool{}}
		g.retired.Store(true)
		g.failPending(ErrRemoved)
		h.retiring[g.id] = g
		h.wakeGroup(g)
		h.log.Info("replica removed from group; it votes until every voter knows", "group", uint64(g.id), "replica", uint64(g.replica))
	}
	lv := g.retiring
	if lv.voters == nil || conf > lv.conf {
		lv.conf = conf
		lv.voters = make(map[ReplicaID]NodeID, len(voters))
		for _, m := range voters {
			lv.voters[m.Replica] = m.Node
		}
		lv.asked = 0
	}
	if from != 0 {
		lv.confirmed[from] = true
	}
	for r, n := range lv.voters {
		// A voter on this node is a newer replica of the group, waiting
		// for this one to be destroyed: it joined without this one.
		if !lv.confirmed[r] && n != h.cfg.NodeID {
			return
		}
	}
	delete(h.retiring, g.id)
	g.retiring = nil
	h.log.Info("replica removed from group", "group", uint64(g.id), "replica", uint64(g.replica))
	g.markRemoved()
}

// askRetire sends RetireQueries to the voters. Those that answered
// before are asked again: a voter that is dead never answers, and only
// an answer naming a newer configuration, which replaced it, lets this
// replica go.
func (g *group) askRetire() {
	lv := g.retiring
	lv.asked = g.h.tick
	for _, r := range sortedKeys(lv.voters) {
		if n := lv.voters[r]; n != 0 && n != g.h.cfg.NodeID {
			b := g.h.outbox(n)
			b.RetireQueries = append(b.RetireQueries, GroupReplica{Group: g.id, Replica: g.replica})
		}
	}
}

// askRetirements asks for the retiring replicas' retirement, each every
// pingTicks.
func (h *Host) askRetirements() {
	for _, id := range h.sortedGroups(h.retiring) {
		g := h.retiring[id]
		if g.removed || g.broken != nil || h.groups[id] != g {
			delete(h.retiring, id)
			continue
		}
		if g.retiring.asked == 0 || h.tick-g.retiring.asked >= h.pingTicks() {
			g.askRetire()
		}
	}
}

// removedNotice tells replica r that this replica's configuration does
// not have it.
func (g *group) removedNotice(r ReplicaID) RemovedNotice {
	return RemovedNotice{Group: g.id, Replica: r, From: g.replica, Conf: g.lastConfIndex, Voters: g.voters()}
}

// voters returns the voters of the applied configuration (both halves of
// a joint one) with their nodes.
func (g *group) voters() []Member {
	var vs []Member
	seen := map[uint64]bool{}
	for _, ids := range [][]uint64{g.confState.GetVoters(), g.confState.GetVotersOutgoing()} {
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				vs = append(vs, Member{Replica: ReplicaID(id), Node: g.meta.members[ReplicaID(id)]})
			}
		}
	}
	return vs
}

// Retire tells the host that group id removed its replica, by a change
// the replica may not have applied yet, and that voters are the voters
// the group has now (as the application recorded them): the replica
// retires as if a voter had said so (learnRemoved), then asks them
// whether they count it removed. A replica that is
// still a member is never confirmed, so it is never Removed: it only
// stops taking requests. A replica that never received the group's
// state is Removed at once.
func (h *Host) Retire(id GroupID, voters []Member) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	g, err := h.liveGroup(id)
	if err != nil {
		return err
	}
	if !g.initialized() {
		// It never held the group's log: no one waits for its vote.
		g.markRemoved()
		return nil
	}
	g.learnRemoved(0, voters, 0)
	return nil
}

// checkMembership starts retiring if this replica's applied configuration
// does not have it.
func (g *group) checkMembership() {
	if !g.initialized() {
		return
	}
	if _, ok := g.meta.members[g.replica]; !ok {
		g.learnRemoved(g.lastConfIndex, g.voters(), 0)
	}
}
