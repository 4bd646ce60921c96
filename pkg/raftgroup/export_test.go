package raftgroup

// FollowMinProposals exposes followMinProposals to the external tests.
const FollowMinProposals = followMinProposals

// FollowEarlyBytes exposes followEarlyBytes to the external tests.
const FollowEarlyBytes = followEarlyBytes
