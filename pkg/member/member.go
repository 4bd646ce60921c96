package member

import (
	"context"
	"fmt"
	"time"
)

// State is what a node believes about a member's liveness.
type State uint8

// The states, in precedence order: at equal incarnation a later one in this
// list wins. That order is what makes the table a join-semilattice (see
// Update.Supersedes).
const (
	Alive State = iota
	Suspect
	Dead
	Left
)

var stateNames = [...]string{"alive", "suspect", "dead", "left"}

// String returns the state's lowercase name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Member is one row of the membership table as this node sees it.
type Member struct {
	ID          string
	Addr        string
	Incarnation uint64
	State       State
	// Since is the local time of the last state change; it is not
	// disseminated because clocks differ between nodes.
	Since time.Time
}

// Update returns what would be disseminated about m.
func (m Member) Update() Update {
	return Update{ID: m.ID, Addr: m.Addr, Incarnation: m.Incarnation, State: m.State}
}

// Update is a claim about one member. Updates travel piggybacked on pings
// and acks, and statd may carry them on any other message too: applying
// them is commutative, associative and idempotent, so it does not matter
// how often or in which order they arrive.
type Update struct {
	ID          string
	Addr        string
	Incarnation uint64
	State       State
}

// Supersedes reports whether u carries newer information than v about the
// same member: a higher incarnation, or the same incarnation and a state
// later in the order Alive < Suspect < Dead < Left.
//
// This one total order per member encodes all the SWIM rules: Alive(i)
// beats Alive/Suspect(j) only if i > j, Suspect(i) beats Alive(j) if i >= j,
// Dead(i) and Left(i) beat Alive/Suspect(j) if i >= j, a Dead member is
// Alive again only at a strictly greater incarnation, and Left is final for
// its incarnation. Because it is a total order, "keep the maximum" is a
// lattice join, which is why every node converges on the same table
// whatever the delivery order.
func (u Update) Supersedes(v Update) bool {
	if u.Incarnation != v.Incarnation {
		return u.Incarnation > v.Incarnation
	}
	return u.State > v.State
}

func (u Update) String() string {
	return fmt.Sprintf("%s/%s@%d", u.ID, u.State, u.Incarnation)
}

// Config tunes the protocol. Zero fields take DefaultConfig's values.
type Config struct {
	// ProbeInterval is the length of a protocol round: one probe per round,
	// and a probe that got no ack (direct or indirect) by the end of its
	// round marks the target Suspect.
	ProbeInterval time.Duration
	// ProbeTimeout bounds a direct ping before indirect probes start, and
	// the ping a node sends on another's behalf. It should exceed the
	// 99th-percentile round trip and stay below about half ProbeInterval,
	// so that ping requests about a live target are answered before the
	// round ends.
	ProbeTimeout time.Duration
	// SuspicionTimeout is how long a member stays Suspect on a node before
	// that node declares it Dead, unless it refutes first. Every node runs
	// its own timer from when it learned of the suspicion.
	SuspicionTimeout time.Duration
	// IndirectProbes is how many members are asked to ping a target that
	// missed the direct ping (SWIM's k).
	IndirectProbes int
	// RetransmitMult scales how often each update is piggybacked:
	// RetransmitMult×ceil(log10(N+1)) messages, as in memberlist.
	RetransmitMult int
	// MaxPiggyback bounds the queued updates carried by one message.
	MaxPiggyback int
	// GossipInterval and GossipFanout pace dissemination between probes:
	// while updates are queued, every GossipInterval they are pushed to
	// GossipFanout random live members with a Ping, whose ack brings theirs
	// back. Probe traffic alone spreads news in O(log N) probe rounds; this
	// cuts it to a fraction of that, and costs nothing when there is no
	// news. A negative GossipFanout disables it.
	GossipInterval time.Duration
	GossipFanout   int
	// DeadProbeEvery makes every DeadProbeEvery-th round also ping one
	// random Dead member, so that healed partitions and returning nodes
	// are found again. Negative disables it.
	DeadProbeEvery int
}

// DefaultConfig is tuned for LANs of 1–300 nodes. In the package's
// simulations (1 ms latency) a killed node is Dead on every other node
// within about 3 s (median) and 4.5 s (99th percentile); no live node was
// declared Dead at 10% message loss. Each node sends 2.5 pings a second,
// plus up to 15 gossip pings a second while there is news.
//
// The suspicion timeout does not grow with log N as memberlist's does:
// there, false positives come from the suspect and the others learning of
// the suspicion and the refutation slowly, and here they learn within a
// few hundred milliseconds at 300 nodes (gossip, and the suspect is told
// directly). What remains is gossip that misses a node, which
// RetransmitMult (6, where memberlist has 4) makes rare and answering
// stale news with fresher news repairs.
func DefaultConfig() Config {
	return Config{
		ProbeInterval:    400 * time.Millisecond,
		ProbeTimeout:     200 * time.Millisecond,
		SuspicionTimeout: 2 * time.Second,
		IndirectProbes:   3,
		RetransmitMult:   6,
		MaxPiggyback:     16,
		GossipInterval:   200 * time.Millisecond,
		GossipFanout:     3,
		DeadProbeEvery:   5,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = d.ProbeInterval
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = d.ProbeTimeout
	}
	if c.SuspicionTimeout <= 0 {
		c.SuspicionTimeout = d.SuspicionTimeout
	}
	if c.IndirectProbes <= 0 {
		c.IndirectProbes = d.IndirectProbes
	}
	if c.RetransmitMult <= 0 {
		c.RetransmitMult = d.RetransmitMult
	}
	if c.MaxPiggyback <= 0 {
		c.MaxPiggyback = d.MaxPiggyback
	}
	if c.GossipInterval <= 0 {
		c.GossipInterval = d.GossipInterval
	}
	if c.GossipFanout == 0 {
		c.GossipFanout = d.GossipFanout
	}
	if c.DeadProbeEvery == 0 {
		c.DeadProbeEvery = d.DeadProbeEvery
	}
	return c
}

// Transport carries the two requests of the protocol. statd implements it
// over its mutual-TLS gRPC connections; the receiving side calls
// List.HandlePing and List.HandlePingReq. The transport identifies the
// sender to the receiver (statd takes the node ID from the peer's
// certificate).
//
// Calls must return promptly once ctx is done: the driver cancels ctx at
// the probe timeout or the end of the round.
type Transport interface {
	// Ping sends updates to target and returns the updates piggybacked on
	// its ack. An error means no ack.
	Ping(ctx context.Context, target Member, updates []Update) ([]Update, error)
	// PingReq asks via to ping target on our behalf; acked reports whether
	// target answered via. An error means via did not answer.
	PingReq(ctx context.Context, via, target Member, updates []Update) (acked bool, piggyback []Update, err error)
}

// Clock is the time source, injected so that tests run in virtual time.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// SystemClock returns the real clock.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Stats counts protocol events on this node since New.
type Stats struct {
	ProbesSent     uint64 // direct pings of the round's target
	DeadProbesSent uint64 // pings of a random Dead member
	GossipSent     uint64 // pings sent only to disseminate queued updates
	Acks           uint64 // direct acks received (including from Dead members)
	IndirectProbes uint64 // ping requests sent to other members
	IndirectAcks   uint64 // ping requests that reported an ack
	PingsServed    uint64 // pings answered
	PingReqsServed uint64 // ping requests handled for others
	Suspicions     uint64 // members this node marked Suspect after a failed probe
	DeadDeclared   uint64 // suspicions that this node's own timer turned into Dead
	Refutations    uint64 // times this node raised its incarnation to refute a claim
	UpdatesApplied uint64 // updates that changed the table
	UpdatesIgnored uint64 // updates that were stale or duplicate
}
