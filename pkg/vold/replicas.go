package vold

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// Changing a volume's replica count (UpdateVolume). The API checks that
// enough nodes can take the replicas asked for and writes the count into
// the volume's document; the group's leader then moves its members
// there in its repair rounds (scaleVolumes), one step a round, so that a
// leader that changes or a vold that restarts midway loses nothing: the
// next leader reads the same document and carries on.
//
//   - Growing: the new replicas are placed as repair places a replacement
//     (live nodes that hold none of the volume, answer a ping at its
//     level and have room), added to the document marked as learners,
//     and joined to the group as learners, which catch up from a snapshot
//     without counting in any quorum: writes go on meanwhile. A learner
//     is promoted to voter in a later round, once it holds what the group
//     had committed at the round before (commitMarks): a snapshot alone
//     can leave it a log's length behind, and a voter that far behind
//     would stall the group's commits if another voter failed.
//   - Shrinking: the voters to remove are picked (dead or silent ones
//     first, then the newest replicas; never the leader) and removed in
//     one change, through a joint configuration when there are several.
//     Their nodes' volds see the document no longer place them and
//     retire the replicas (reconcile.go).
//
// A dead voter is repair's (repairGroup) to replace first, unless the
// group shrinks: then it is the first to go.

// electionTicks is the Raft hosts' election timeout in ticks (raft_tick).
const electionTicks = 10

// checkScale reports why d's volume cannot have replicas replicas: too
// few nodes can take the replicas it would add.
func (n *node) checkScale(ctx context.Context, name string, d *volumeDoc, replicas int) error {
	more := replicas - len(d.Members)
	if more <= 0 {
		return nil
	}
	if picked := n.placeReplicas(ctx, d, more, n.takenFor(d, raftgroup.GroupStatus{}, nil)); len(picked) < more {
		return fmt.Errorf("volume %q has %d replicas and cannot have %d: %d more need as many live nodes that hold none of it, run a vold that answers and lets its level, and have %s free; %d can: %w",
			name, len(d.Members), replicas, more, humanBytes(d.SizeBytes), len(picked), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// setReplicaCount writes replicas into d's volume's document, for its
// group's leader to act on (scaleVolumes).
func (n *node) setReplicaCount(ctx context.Context, name string, d *volumeDoc, replicas int) error {
	if d.Replicas == replicas {
		return nil
	}
	if err := n.putSetting(ctx, name, d, fieldReplicasSet, int64(replicas)); err != nil {
		return err
	}
	n.log.Info("volume replica count set", "volume", name, "group", d.Group, "replicas", replicas, "members", len(d.Members))
	d.Replicas = replicas
	return nil
}

// takenFor returns the nodes that cannot take a new replica of d's
// group, whose status (on its leader) is st: those its document places
// one on, those of its voters, and the silent ones.
func (n *node) takenFor(d *volumeDoc, st raftgroup.GroupStatus, silent map[string]bool) map[string]bool {
	out := map[string]bool{}
	for _, m := range d.Members {
		out[m.Node] = true
	}
	for _, v := range st.Voters {
		out[n.names.name(v.Node)] = true
	}
	for node := range silent {
		out[node] = true
	}
	return out
}

// placeReplicas picks up to count nodes for new replicas of d's volume,
// none of them in exclude, that answer a ping at the volume's level (a
// replacement, or a replica added to grow the group).
func (n *node) placeReplicas(ctx context.Context, d *volumeDoc, count int, exclude map[string]bool) []string {
	ex := maps.Clone(exclude)
	if ex == nil {
		ex = map[string]bool{}
	}
	level := uint32(1)
	if h := n.host.Load(); h != nil {
		level = max(level, volumeLevel(h, d.group()))
	}
	cands := n.candidates()
	for _, c := range cands {
		// A replica on a vold that does not know the volume's level
		// would stop at its snapshot (volfs.ErrLevel).
		if n.fsLevel(c.Node) < level {
			ex[c.Node] = true
		}
	}
	picked, _ := placeAnswering(cands, count, ex, d.SizeBytes,
		func(ids []string) map[string]bool { return n.answeringAt(ctx, ids, level) }, false)
	return picked
}

// scaling reports whether d asks its leader for a step: its replica
// count is not its members', or a member is still a learner.
func (d *volumeDoc) scaling() bool {
	return d.Replicas > 0 && (d.Replicas != len(d.Members) || slices.ContainsFunc(d.Members, func(m docMember) bool { return m.Learner }))
}

// scaleVolumes takes a step towards its replica count for every volume
// whose group this node leads and whose document asks for one.
func (n *node) scaleVolumes(ctx context.Context, h *raftgroup.Host, silent map[string]bool) {
	marks := n.commitMarks
	n.commitMarks = map[raftgroup.GroupID]uint64{}
	for name, d := range n.volumeDocs() {
		if ctx.Err() != nil {
			return
		}
		if name == systemVolume || !d.scaling() {
			continue
		}
		st, ok := leading(h, d.group())
		if !ok {
			continue
		}
		if len(st.Learners) > 0 {
			n.commitMarks[d.group()] = st.Commit
		}
		if err := n.scaleGroup(ctx, name, d, st, marks[d.group()], silent); err != nil {
			n.log.Warn("change volume's replica count", "volume", name, "group", d.Group, "replicas", d.Replicas, "err", err)
		}
	}
}

// scaleGroup takes one step of the scaling of a group this node leads:
// promote caught-up learners (those that hold mark, the commit index of
// the round before; none while it is 0), add learners, or remove voters.
func (n *node) scaleGroup(ctx context.Context, name string, d *volumeDoc, st raftgroup.GroupStatus, mark uint64, silent map[string]bool) error {
	want, voters := d.Replicas, len(st.Voters)
	h := n.host.Load()
	// down: statd calls its node dead, or its vold has been silent long
	// enough for repair to replace it. answers: its vold sent this
	// leader's something within an election timeout (volds that share
	// groups ping each other three times per one, quiesced or not), and
	// it is not down. statd's word that a node died comes seconds after
	// its vold falls silent: a change that counts on a voter or learner
	// answering goes by what this leader hears.
	down := func(m raftgroup.Member) bool {
		node := n.names.name(m.Node)
		return n.deadFor(node) > 0 || silent[node]
	}
	silence := n.peerSilence(h)
	answers := func(m raftgroup.Member) bool {
		node := n.names.name(m.Node)
		return m.Replica == st.Leader || !down(m) && silence[node] < electionTicks*time.Duration(n.cfg.RaftTick) && n.alive(node)
	}
	if voters <= want && slices.ContainsFunc(st.Voters, down) {
		// Repair replaces it first; a shrink removes it instead.
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, changeTimeout)
	defer cancel()
	var changes []raftgroup.Change
	var what string
	switch {
	case len(st.Learners) > 0:
		var promoted, removed []raftgroup.Member
		changes, promoted, removed = learnerStep(voters, want, st.Learners, st.Progress, mark, down, answers)
		what = fmt.Sprintf("promote learners [%s], remove learners [%s]", memberNames(n.names, promoted), memberNames(n.names, removed))
	case voters < want:
		picked := n.placeReplicas(ctx, d, want-voters, n.takenFor(d, st, silent))
		if len(picked) == 0 {
			n.log.Debug("no node for a new replica", "volume", name, "replicas", want)
			return nil
		}
		next, err := h.NextReplicaID(d.group())
		if err != nil {
			return err
		}
		first := max(uint64(next), uint64(st.MaxReplica)+1, d.maxReplica()+1)
		var added []docMember
		for i, node := range picked {
			id, err := n.names.add(node)
			if err != nil {
				return err
			}
			m := docMember{Node: node, Replica: first + uint64(i), Added: time.Now().UTC(), Learner: true}
			added = append(added, m)
			changes = append(changes, raftgroup.Change{Type: raftgroup.AddLearner, Replica: raftgroup.ReplicaID(m.Replica), Node: id})
		}
		// In the document first, so that the nodes' volds create the
		// replicas that join.
		if err := n.updateMembers(ctx, name, d.group(), func(ms []docMember) []docMember { return append(ms, added...) }); err != nil {
			return fmt.Errorf("add learners to the document: %w", err)
		}
		what = "add learners " + memberList(added)
	case voters > want:
		// Removing a voter that answers while keeping one that does not
		// would leave the group without a quorum.
		victims, ok := shrinkStep(st.Voters, st.Leader, want, answers)
		if !ok {
			n.log.Warn("not removing voters yet: those left would not have a quorum that answers", "volume", name, "group", d.Group, "replicas", want, "voters", voters)
			return nil
		}
		for _, v := range victims {
			changes = append(changes, raftgroup.Change{Type: raftgroup.RemoveReplica, Replica: v.Replica})
		}
		what = fmt.Sprintf("remove %d voters (%s)", len(victims), memberNames(n.names, victims))
	}
	if len(changes) == 0 {
		// Only the document lags: a learner promoted (or members changed)
		// before a leader change.
		return n.syncMembers(ctx, name, d.group(), st.Voters, st.Learners, st.MaxReplica)
	}
	n.log.Info("changing volume's replica count", "volume", name, "group", d.Group, "replicas", want, "voters", voters, "step", what)
	m, err := h.ChangeMembership(cctx, d.group(), changes...)
	if err != nil {
		if errors.Is(err, raftgroup.ErrReplicaIDReused) || errors.Is(err, raftgroup.ErrInvalidChange) {
			// The next round starts afresh from the group's members.
			_ = n.syncMembers(ctx, name, d.group(), st.Voters, st.Learners, st.MaxReplica)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	n.stats.scaleSteps.Add(1)
	maxRep := st.MaxReplica
	for _, c := range changes {
		maxRep = max(maxRep, c.Replica)
	}
	return n.syncMembers(ctx, name, d.group(), m.Voters, m.Learners, maxRep)
}

// learnerStep decides a step for a group with voters voters and
// learners, which should have want voters: a learner whose node is down,
// or that is not wanted any more (fewer asked for since), goes, and a
// later round places another if need be; one the leader replicates to
// normally (it took its snapshot and follows the log, progress), that
// holds the log up to mark (a commit index of an earlier round; 0: not
// known yet) and that answers becomes a voter, up to want (a voter that
// does not answer could cost the group its quorum: two voters, one
// silent, have none; one far behind would stall its commits until it
// caught up, should another fail); the others are left to catch up, or
// to answer again. A mark from the round before, not the commit index of
// this one, lets a learner of a busy group qualify: it trails the commit
// by the entries in flight, but soon holds what was committed seconds
// ago.
func learnerStep(voters, want int, learners []raftgroup.Member, progress map[raftgroup.ReplicaID]raftgroup.ReplicaProgress, mark uint64, down, answers func(raftgroup.Member) bool) (changes []raftgroup.Change, promoted, removed []raftgroup.Member) {
	for _, l := range learners {
		p := progress[l.Replica]
		switch {
		case len(promoted)+voters >= want || down(l):
			changes = append(changes, raftgroup.Change{Type: raftgroup.RemoveReplica, Replica: l.Replica})
			removed = append(removed, l)
		case p.State == "StateReplicate" && mark > 0 && p.Match >= mark && answers(l):
			changes = append(changes, raftgroup.Change{Type: raftgroup.AddVoter, Replica: l.Replica, Node: l.Node})
			promoted = append(promoted, l)
		}
	}
	return changes, promoted, removed
}

// shrinkStep picks the voters to remove so that want are left, in
// removeOrder (those that do not answer first), and reports whether a
// majority of those left answers; if not, nothing may be removed yet: the
// group would stop until a voter came back.
func shrinkStep(voters []raftgroup.Member, leader raftgroup.ReplicaID, want int, answers func(raftgroup.Member) bool) ([]raftgroup.Member, bool) {
	victims := removeOrder(voters, leader, func(m raftgroup.Member) bool { return !answers(m) })[:len(voters)-want]
	left, answering := 0, 0
	for _, v := range voters {
		if slices.ContainsFunc(victims, func(x raftgroup.Member) bool { return x.Replica == v.Replica }) {
			continue
		}
		left++
		if answers(v) {
			answering++
		}
	}
	return victims, answering >= left/2+1
}

// memberNames lists members as node/replica.
func memberNames(names *nodeNames, ms []raftgroup.Member) string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s/%d", names.name(m.Node), m.Replica))
	}
	return strings.Join(out, ",")
}

// removeOrder returns voters in the order a shrink removes them: those
// down first, then the newest replicas (highest IDs), the leader never.
func removeOrder(voters []raftgroup.Member, leader raftgroup.ReplicaID, down func(raftgroup.Member) bool) []raftgroup.Member {
	out := slices.DeleteFunc(slices.Clone(voters), func(m raftgroup.Member) bool { return m.Replica == leader })
	slices.SortStableFunc(out, func(a, b raftgroup.Member) int {
		if da, db := down(a), down(b); da != db {
			if da {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.Replica, a.Replica)
	})
	return out
}
