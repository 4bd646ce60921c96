package raftgroup

// FollowMinProposals exposes followMinProposals to the external tests.
const FollowMinProposals = followMinProposals
