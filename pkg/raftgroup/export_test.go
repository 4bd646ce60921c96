package raftgroup

// FollowMinProposals exposes followMinProposals to the external tests.
const FollowMinProposals = followMinProposals

// FollowEarlyBytes exposes followEarlyBytes to the external tests.
const FollowEarlyBytes = followEarlyBytes

// JournalSegmentsHeld returns, for each group whose log references
// journal segments, how many it references.
func (h *Host) JournalSegmentsHeld() map[GroupID]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[GroupID]int{}
	for _, m := range h.jnl.refs {
		for g := range m {
			out[g]++
		}
	}
	return out
}
