// Package member tells each statd which cluster nodes are alive, suspect,
// dead or gone, so that every node ends up with the same view. It is
// SWIM-style failure detection and membership (Das, Gupta and Motivala,
// DSN 2002) with the refinements memberlist and Lifeguard made practical.
// It has no I/O of its own: statd carries its two requests over the mutual-TLS
// gRPC connections it already has.
//
// # Why not hashicorp/memberlist
//
// memberlist is the obvious library, but it brings its own UDP and TCP
// transport, and every Shoal peer connection must be mutual TLS with the
// cluster CA. Its pluggable transport still assumes packet semantics and a
// separate stream channel for full-state push-pull, which we would have to
// tunnel. The protocol itself is small; owning it also lets the tests
// drive it in virtual time.
//
// # Failure detection: probe, ask others, suspect
//
// Heartbeats to everyone cost O(N²) messages. SWIM instead has every node
// probe one member per round (ProbeInterval): a direct ping, and if no ack
// arrives within ProbeTimeout, ping requests to IndirectProbes random
// members who ping the target on its behalf. Only when neither path
// brings an ack by the end of the round is the target suspected. The
// indirect path is what keeps a lossy link between two nodes from
// accusing a healthy one. Every node's load is constant whatever N is, and
// so is the expected time until somebody probes a crashed node: about 1.6
// rounds (each round, each of the N-1 others probes it with probability
// 1/(N-1)).
//
// Targets come from a shuffled round-robin over the other members, not
// independent random picks, so every live member is probed by every node
// once per pass: the worst-case time to first detection is bounded.
//
// # Suspicion and incarnations
//
// A failed probe does not kill, it accuses: the target becomes Suspect,
// the accusation is disseminated, and every node that hears it starts its
// own SuspicionTimeout timer, after which it declares the member Dead. A
// suspect that hears of its suspicion refutes it by raising its
// incarnation number and disseminating Alive. Incarnations are what let
// claims be ordered without synchronised clocks: only the member itself
// ever raises its own. The rule for two claims about one member is a total
// order (see Update.Supersedes): higher incarnation wins, and at equal
// incarnations Alive < Suspect < Dead < Left. That one rule gives SWIM's
// precedence table, and because it is a total order, "keep the greatest"
// is a lattice join: the table converges whatever the order, batching or
// duplication of deliveries, which the property tests check. Dead needs a
// strictly higher incarnation to come back, and Left is final for its
// incarnation. One exception, below under partitions: a node takes another's
// Dead about a member it holds alive as a suspicion, so the join holds once
// suspicions have run out rather than at every instant.
//
// A node that restarts must outrank everything said about its previous
// life without persisting anything: statd passes its start time in Unix
// milliseconds as the initial incarnation, which exceeds the old one
// unless the old process refuted more times than it lived milliseconds.
//
// Suspicion is how SWIM trades detection time against false positives.
// A suspect needs to hear of its suspicion and its refutation needs to
// reach the others within the timeout. So every message to a member this
// node does not think alive carries that member's record: a suspect learns
// at its first contact, not when gossip happens to reach it, and a node
// wrongly declared Dead that pings anyone (or is pinged, see below) is
// told and refutes. Gossip reaches the others in a few hundred
// milliseconds, which is why the timeout does not need to grow with log N
// as memberlist's does (see DefaultConfig).
//
// # Dissemination
//
// News rides on the protocol's own messages (SWIM's "infection-style"
// dissemination): every ping, ack and ping request carries the sender's
// own record and up to MaxPiggyback queued updates, least-sent and newest
// first. Each update is sent RetransmitMult×ceil(log10(N+1)) times, which
// is enough for an epidemic to reach every node with high probability.
// Probes alone spread news in O(log N) rounds, so while there is news a
// node also pushes it to GossipFanout random members every GossipInterval
// (a Ping, whose ack pulls the other side's news back); with nothing queued
// this costs nothing. Nobody is told what it told us, or news about itself.
//
// An epidemic with a finite number of sends can still miss a node. Two
// rules repair that without memberlist's periodic full-state exchange: a
// node that receives a claim older than what it knows answers with what
// it knows, and a node that missed a death or a departure eventually
// probes that member, suspects it, and has its stale suspicion corrected
// that way. Snapshot and Apply let statd do a full exchange when a node
// joins, and Outgoing and Apply let it piggyback updates on its data
// gossip.
//
// # Partitions and returning nodes
//
// After a partition each side declares the other Dead, and classic SWIM
// never probes Dead members again: the halves would stay apart after the
// network heals. So every DeadProbeEvery-th round a node also pings one
// random Dead member. If it answers, the ping told it it is considered
// dead (it refutes), and its ack, which carries our record if it thinks
// us dead, makes us refute too; the refutations spread as any news.
// Left members are not probed: they come back by talking first, with a
// higher incarnation.
//
// A heal also brings each side's verdicts on the other's members, still
// queued for retransmission. In classic SWIM a node takes "Dead" about a
// member of its own side, one it heard from a moment ago, from the first
// message of the other side, and schedd replaces that member's tasks before
// the member hears and refutes (the e2e partition test caught this). So only
// a node's own suspicion timer kills a member it holds Alive or Suspect:
// another's Dead starts (or leaves running) a suspicion here, which the
// member refutes in time if it lives, while a member already Dead here, or
// only known from a node document (never heard of), takes Dead at once. A
// real death costs little for it: the Suspect spreads ahead of the verdict,
// so most nodes' timers are running when it comes (the simulations see
// about 0.1 s more until Dead on every node).
//
// # Structure
//
// The protocol is a deterministic state machine (round, handle, gossip,
// expire) that takes the time and returns the messages to send; Run is a
// thin driver that executes them over the Transport with timers from the
// Clock. The tests drive the same state machine from a discrete-event
// simulation with virtual time, seeded loss and latency, partitions and
// crashes, which makes multi-minute runs of 100 nodes take a second and
// replay exactly.
package member
