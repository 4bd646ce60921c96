// Package gossip spreads documents between the statd daemons of a cluster.
//
// Two mechanisms share one store (package store):
//
//   - Push (the fast path). Every change committed locally — a client's
//     write or a document merged from a peer — is pushed to Fanout random
//     live peers at once, then again to fresh random peers in the next
//     PushRounds-1 rounds. Receivers merge what they get and, since merging
//     a new document commits a change there too, push it on: an epidemic
//     in which each node tells Fanout×PushRounds others, so the chance a
//     node is never told falls like e^(−Fanout×PushRounds). A merge that
//     changes nothing commits nothing, so rumours die out by themselves.
//
//   - Anti-entropy (the guarantee). Every AntiEntropyInterval a node picks
//     a random live peer and compares Merkle Search Tree roots. Equal roots
//     end the round: an idle exchange is two hashes. Otherwise each side
//     pulls the other's tree nodes under differing subtrees only (mst.Pull,
//     one round trip per tree level), fetches the documents behind the
//     entries it lacks and merges them. Because the index is ordered by
//     write time (see package store), what two peers disagree on is mostly
//     recent, hence adjacent in the tree, hence cheap to find.
//
// The package is transport-agnostic: statd wires it to mutual-TLS gRPC,
// the simulation benchmark to direct calls. Membership (who is alive) comes
// from package member through the Peers interface.
package gossip
