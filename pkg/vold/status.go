package vold

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// statusTimeout bounds asking one member for its status.
const statusTimeout = 2 * time.Second

// replicaStatus is one replica's live status (VolPeer.Forward "status").
type replicaStatus struct {
	Node    string `json:"node"`
	Replica uint64 `json:"replica"`
	Role    string `json:"role"`
	Leader  string `json:"leader,omitempty"`
	Term    uint64 `json:"term"`
	Commit  uint64 `json:"commit"`
	Applied uint64 `json:"applied"`
	// LastIndex is the last entry of the replica's log: durable here,
	// maybe not applied yet (see inspect).
	LastIndex   uint64 `json:"last_index,omitempty"`
	Digest      string `json:"digest,omitempty"`
	UsedBytes   int64  `json:"used_bytes"`
	HeldFiles   uint64 `json:"held_files,omitempty"`
	Level       uint32 `json:"level,omitempty"`
	Initialized bool   `json:"initialized"`
	// Voters are the group's voters as this replica knows them.
	Voters []raftgroup.Member `json:"voters,omitempty"`
}

// localStatus describes this node's replica of g. With digest, it has
// the digest of the state at Applied: the filesystem's for a volume (a
// SHA-256 of every byte, which volume listings leave out), the typed
// snapshot's for the system group.
func (n *node) localStatus(g raftgroup.GroupID, digest bool) (replicaStatus, error) {
	h, err := n.raftHost()
	if err != nil {
		return replicaStatus{}, err
	}
	st, err := h.Status(g)
	if err != nil {
		return replicaStatus{}, err
	}
	rs := replicaStatus{
		Node: n.id, Replica: uint64(st.Replica), Role: st.Role, Term: st.Term,
		Commit: st.Commit, Applied: st.Applied, LastIndex: st.LastIndex, Initialized: st.Initialized, Voters: st.Voters,
	}
	switch {
	case !st.Initialized:
		rs.Role = "joining"
	case slices.ContainsFunc(st.Learners, func(m raftgroup.Member) bool { return m.Replica == st.Replica }):
		// Added to grow the group, catching up before it votes.
		rs.Role = "learner"
	}
	if st.LeaderNode != 0 {
		rs.Leader = n.names.name(st.LeaderNode)
		n.leaders.Store(g, rs.Leader)
	}
	for range 5 {
		var (
			sm               raftgroup.StateMachine
			applied, fsIndex uint64
			snap             []byte
		)
		if err := h.WithStateMachine(g, func(s raftgroup.StateMachine, a uint64) {
			sm, applied = s, a
			switch s := s.(type) {
			case *raftgroup.Typed:
				// Small (keys and leases): read here, consistent with applied.
				snap, _ = s.Snapshot()
			case *volfs.FS:
				fsIndex = s.Applied()
			}
		}); err != nil {
			return replicaStatus{}, err
		}
		rs.Applied = applied
		switch s := sm.(type) {
		case *raftgroup.Typed:
			d := sha256.Sum256(snap)
			rs.Digest = hex.EncodeToString(d[:])
			return rs, nil
		case *volfs.FS:
			// The digest of a large volume is computed outside the host's
			// loop (and outside the filesystem's lock, so writes go on);
			// it is at applied if no entry reached the filesystem
			// meanwhile (configuration entries do not).
			rs.HeldFiles, rs.Level = s.Held(), s.Level()
			if !digest {
				rs.UsedBytes = s.Used()
				return rs, nil
			}
			d, used, at := s.Summary()
			rs.UsedBytes = used
			rs.Digest = hex.EncodeToString(d[:])
			if at == fsIndex {
				return rs, nil
			}
		default:
			return rs, nil
		}
	}
	return rs, nil
}

// holdsCommitted reports whether a replica holds everything its leader
// committed, applied or in its log. The log counts only in the leader's
// term: a replica back from a partition may hold entries of an older one
// past the commit, until the leader's appends replace them.
func holdsCommitted(st replicaStatus, leaderCommit, leaderTerm uint64) bool {
	return st.Applied >= leaderCommit || st.Term == leaderTerm && st.LastIndex >= leaderCommit
}

// statusRequest is the payload of a forwarded status request. Empty (as
// older volds send it) asks for the digest.
type statusRequest struct {
	NoDigest bool `json:"no_digest,omitempty"`
}

// memberStatus asks the member on node for its replica's status, with
// its digest if digest.
func (n *node) memberStatus(ctx context.Context, node string, g raftgroup.GroupID, digest bool) (replicaStatus, error) {
	if node == n.id {
		return n.localStatus(g, digest)
	}
	if n.deadFor(node) > 0 {
		return replicaStatus{}, fmt.Errorf("node %s is dead: %w", node, errdefs.ErrUnavailable)
	}
	cctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	c, err := n.pool.client(node)
	if err != nil {
		return replicaStatus{}, err
	}
	var payload []byte
	if !digest {
		payload, _ = json.Marshal(statusRequest{NoDigest: true})
	}
	resp, err := c.Forward(cctx, &volv1.ForwardRequest{Group: uint64(g), Kind: kindStatus, Payload: payload})
	if err != nil {
		return replicaStatus{}, err
	}
	var rs replicaStatus
	err = json.Unmarshal(resp.GetPayload(), &rs)
	if err == nil && rs.Leader != "" {
		n.leaders.Store(g, rs.Leader)
	}
	return rs, err
}

// volumeProto renders a document (no live status).
func (n *node) volumeProto(name string, d *volumeDoc) *volv1.Volume {
	v := &volv1.Volume{
		Name: name, Group: d.Group, Replicas: int32(d.Replicas), SizeBytes: d.SizeBytes,
		Created: timestamppb.New(d.Created),
	}
	for _, m := range d.Members {
		v.Members = append(v.Members, &volv1.Member{Node: m.Node, Replica: m.Replica})
	}
	v.MountedOn, v.UsedBy = n.mountUsers(name)
	return v
}

// inspect renders a volume with the live status of every member, asked in
// parallel. Health: healthy when every member is alive, answers and
// holds everything the leader committed (applied, or in its log: a
// leader tells followers of a commit that only its own node waits for
// with its next append or tick, so a follower of a busy volume often
// holds its last entry unapplied), a member without it asked again
// every lagRecheck, up to lagRechecks times; degraded when a quorum of
// the voters (as the leader counts them: not the replicas still joining
// or learning) answers and there is a leader; unavailable otherwise. Lag is of the
// applied index. Members' digests are there only with digests.
func (n *node) inspect(ctx context.Context, name string, d *volumeDoc, digests bool) *volv1.Volume {
	v := n.volumeProto(name, d)
	type answer struct {
		st  replicaStatus
		err error
	}
	answers := make([]answer, len(d.Members))
	var wg sync.WaitGroup
	for i, m := range d.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := n.memberStatus(ctx, m.Node, d.group(), digests)
			answers[i] = answer{st, err}
		}()
	}
	wg.Wait()
	var leaderCommit, leaderTerm, maxCommit uint64
	var leaderVoters []raftgroup.Member
	for _, a := range answers {
		if a.err != nil {
			continue
		}
		maxCommit = max(maxCommit, a.st.Commit)
		if a.st.Role == "leader" {
			v.Leader = a.st.Node
			leaderCommit, leaderTerm = a.st.Commit, a.st.Term
			v.UsedBytes, v.HeldFiles, v.Level = a.st.UsedBytes, a.st.HeldFiles, a.st.Level
			leaderVoters = a.st.Voters
		}
	}
	// Only voters make the quorum: a replica still joining or learning
	// (added to grow the group, or to replace a dead one) does not count.
	voter := func(m docMember) bool {
		if leaderVoters == nil {
			return !m.Learner
		}
		return slices.ContainsFunc(leaderVoters, func(v raftgroup.Member) bool { return uint64(v.Replica) == m.Replica })
	}
	if v.Leader == "" {
		// No member says it leads; a follower may still know who does.
		for _, a := range answers {
			if a.err == nil && a.st.Leader != "" && slices.ContainsFunc(d.Members, func(m docMember) bool { return m.Node == a.st.Leader }) {
				v.Leader = a.st.Leader
				break
			}
		}
	}
	if leaderCommit == 0 {
		leaderCommit = maxCommit
	}
	v.Commit = leaderCommit
	voters, answering, current := 0, 0, 0
	var behind []int // members that answered without the leader's commit
	for _, m := range d.Members {
		if voter(m) {
			voters++
		}
	}
	for i, m := range d.Members {
		pm := v.Members[i]
		a := answers[i]
		pm.Alive = n.alive(m.Node) && a.err == nil
		if a.err != nil {
			pm.Role = "unreachable"
			if n.alive(m.Node) && (replicaGone(a.err) || status.Code(a.err) == codes.NotFound) {
				// Its vold answers but has not created the replica yet (a
				// member just added), or has just removed it.
				pm.Role = "joining"
			}
			continue
		}
		pm.Role = a.st.Role
		pm.Applied = a.st.Applied
		pm.Digest = a.st.Digest
		if a.st.Applied < leaderCommit {
			pm.Lag = leaderCommit - a.st.Applied
		}
		if v.UsedBytes == 0 {
			v.UsedBytes, v.HeldFiles = a.st.UsedBytes, a.st.HeldFiles
		}
		if v.Level == 0 {
			v.Level = a.st.Level
		}
		if pm.Alive && a.st.Initialized {
			if voter(m) {
				answering++
			}
			if holdsCommitted(a.st, leaderCommit, leaderTerm) {
				current++
			} else {
				behind = append(behind, i)
			}
		}
	}
	if len(behind) > 0 && current+len(behind) == len(d.Members) && v.Leader != "" {
		current += n.caughtUp(ctx, d, behind, leaderCommit, leaderTerm)
	}
	switch {
	case current == len(d.Members) && v.Leader != "":
		v.Health = "healthy"
	case answering >= voters/2+1 && v.Leader != "":
		v.Health = "degraded"
	default:
		v.Health = "unavailable"
	}
	return v
}

// lagRecheck is how long inspect waits before asking a member that lacked
// the leader's commit once more, up to lagRechecks times. A leader sends a
// spare follower its small appends up to raftgroup's Config.DeferAppends
// (10 ms) late, and the members answer at slightly different moments, so
// a volume being written (or just updated) would read as degraded for a
// lag of milliseconds; a busy disk may add some more.
const (
	lagRecheck  = 50 * time.Millisecond
	lagRechecks = 4
)

// caughtUp asks the members at idx of d.Members again, every lagRecheck
// up to lagRechecks times, and returns how many of them held commit (in
// term) at some asking: one that never does is behind for real
// (restarting, cut off, catching up from a snapshot).
func (n *node) caughtUp(ctx context.Context, d *volumeDoc, idx []int, commit, term uint64) int {
	var nodes []string
	for _, i := range idx {
		nodes = append(nodes, d.Members[i].Node)
	}
	held := 0
	for range lagRechecks {
		select {
		case <-ctx.Done():
			return held
		case <-time.After(lagRecheck):
		}
		now := askEach(nodes, func(node string) (struct{}, bool) {
			st, err := n.memberStatus(ctx, node, d.group(), false)
			return struct{}{}, err == nil && st.Initialized && holdsCommitted(st, commit, term)
		})
		held += len(now)
		nodes = slices.DeleteFunc(nodes, func(node string) bool {
			_, ok := now[node]
			return ok
		})
		if len(nodes) == 0 {
			break
		}
	}
	return held
}
