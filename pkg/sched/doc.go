// Package sched is the pure core of Shoal's scheduler: what to run where,
// decided without a master. It owns no goroutine, socket, database or
// container: schedd reads a snapshot of replicated state, calls a function
// here, and executes the actions it gets back (RPCs, state writes,
// containerd calls). The one stateful piece, the node's Ledger, is a small
// mutex-guarded map. docs/SCHEDULING.md is the protocol; this comment is
// how the code implements it.
//
// # Two decision functions
//
// Scheduling is split between two roles that every node plays:
//
//   - the owner of a service, one node chosen by rendezvous hashing over
//     the live members (Owner), runs Reconcile(Snapshot, now, newID) →
//     []Action: it decides which slots need a task and on which nodes;
//   - every node's agent runs AgentDecide(NodeView, now) → []AgentAction:
//     it decides what happens to the tasks on this node.
//
// Both are pure and deterministic (the owner's task IDs come from newID),
// so they are tested with tables and properties, and driven in-process by
// the simulator in package sim, which the benchmark uses too. Both return
// a Requeue action when they wait for time to pass (a backoff, a TTL, an
// update delay); otherwise the executor calls them again when something
// they read changes.
//
// # Documents
//
// A service (/services/<name>) holds the ServiceSpec as JSON, a version
// (+1 per update), the previous spec (for rollback), a state (active,
// paused, rolling-back) and converged, the last version whose rollout
// completed. A slot (/slots/<service>/<slot>) is a place for one task:
// replicas are slots 0..n-1, a global service has a slot per eligible node
// named by the node's ID. Only the owner writes slots: Task names the task
// filling the slot, Next a replacement being started next to it. A task
// (/tasks/<id>) is written only by the node that runs it. Codecs for all of
// these, and for /nodes/<id>, are in docs.go (ServiceFromDoc, SlotFromDoc,
// TaskFromDoc, NodeFromDoc and the Fields methods), so every daemon maps
// fields the same way.
//
// # Placing a task: reservations
//
// The owner filters nodes (alive, active, constraints, host ports, free
// CPU and memory as last seen) and scores them (spread: fewer tasks of the
// service, then near the task's volumes, then more free; binpack: near the
// task's volumes, then less free; Snapshot.VolumeReplicas says which nodes
// hold which volume), in Place. It cannot know
// what other owners are placing at the same moment, so it does not decide:
// it asks. A Reserve action lists ranked candidates; the executor sends the
// Reserve call to the first; the target checks it against its Ledger
// atomically (live reservations + this ≤ capacity, ports free) and accepts
// or rejects with its current free capacity. On a reject the executor asks
// NextCandidate for the next node, skipping nodes known to be full. On an
// accept the target writes the task document (pending) and the owner
// writes the slot document naming the task (Reserve.Accepted). However
// wrong the owners' beliefs, no node is ever overcommitted: the ledger is
// the only judge and it is local.
//
// Scores round free capacity to 1/16 (ScoreBuckets) so that owners
// deciding at once on the same stale figures tie on near-equal nodes, and
// Place's per-slot rendezvous tie-break spreads them out; exact scores
// would send them all to the same node. Every Reserve answer also carries
// the node's free capacity: Usage.WithObservations lets an executor trust
// those figures for a short while over the task documents.
//
// # Confirmation, supersession and the TTL
//
// A reservation is unconfirmed until the slot document names its task
// (the agent then calls Ledger.Confirm). A task that no slot names is
// given the TTL from its creation for its owner to write the slot; after
// that the node stops it and releases its reservation. So an owner that
// crashed between the accept and its slot write leaks nothing.
//
// Duplicates resolve through the slot document, which is a set of
// last-writer-wins registers ordered by (HLC, node ID) stamps. A node
// stops its task as superseded as soon as it sees a slot document written
// after the task was created (slot Stamp > task Created) that names
// another task, or none: the owner chose otherwise, knowing of this task or
// not. Two owners racing for a slot both reserve and both write; the later
// write wins everywhere, and the loser's node stops its copy. A node that
// comes back after a death finds its slots pointing elsewhere and stops
// its stale copies the same way.
//
// A partition is different: both sides live on, each replaces the other's
// tasks as lost, and after the heal the later write would win and stop
// tasks that never stopped running. So a write that replaces a task as
// lost names it (Slot.Lost); the node of that task, if its container still
// runs, keeps it and claims the slot back (ClaimTask: Task.Claim), and the
// owner gives the slot to the older of the two (DESIGN.md 2: the smaller
// (HLC, node ID) wins), so the replacement stops and the heal restores the
// placement from before the split. A slot whose document has not reached
// the owner when the split begins looks vacant there, but the task's own
// document may have: a task of the slot on a node seen dead is replaced as
// lost all the same. When neither document has reached it, the owner
// knows nothing of the slot and marks its write fresh (Slot.Fresh); a task
// the slot had named (its reservation confirmed) claims a fresh write
// back as it would one that named it lost. An owner that does not answer within
// the TTL of the claim lets the replacement win after all. And while
// membership converges after a heal, node by node, an owner that has just
// seen a node come back (Snapshot.Rejoined) does not replace the tasks of
// nodes it still sees dead for DefaultSettle, nor those of a node that
// claimed a slot moments ago, nor a replacement whose Lost task runs on a
// node it sees alive (the write came from the other side; that task's
// claim is on its way): all evidence that the node is alive. A plain
// death, with no node coming back, is replaced at once. Gossip does not
// keep the order of writes across documents, so an owner can see a task
// stopped as superseded before the slot write that superseded it (the one
// that gave the slot back to the older task): the stop records that
// write's time (Task.SupersededAt), and an owner whose copy of the slot is
// older waits for it, up to the TTL, instead of replacing the task.
//
// The owner, for its part, never places twice for one slot while an answer
// may still come: not while a Reserve is in flight (Snapshot.InFlight), not
// while the task its slot names has not shown its document yet, both
// bounded by the TTL. A slot with no task but a recent unnamed task of the
// right spec (a previous owner's accept whose slot write was lost) adopts
// that task instead of placing a new one.
//
// # Replacing tasks
//
// The owner places a new task for a slot whose task is lost (node down),
// unhealthy, stopped, or terminal while its restart policy would allow
// more (after the policy's backoff, inheriting the restart count, bounded
// by MaxAttempts). Tasks on drained nodes, or on nodes whose labels no
// longer meet the constraints, are moved replacement first: the Reserve
// fills Next, and once the replacement runs the owner promotes it to Task
// and the old task is superseded. A global service has exactly one slot per
// eligible node: nodes that join get one, drained or relabelled nodes lose
// theirs, dead nodes keep theirs until they return.
//
// The node restarts crashed containers itself, in place: exponential
// backoff from the policy's Delay doubling to MaxDelay (Backoff), the task
// showing restarting meanwhile, until MaxAttempts. A health check that
// fails Retries times in a row past StartPeriod marks the task unhealthy
// and stops it; its owner replaces it.
//
// # Rolling updates
//
// A task runs the current spec when its spec digest (ServiceSpec.Digest,
// over the spec with defaults) equals the service's. An update walks the
// outdated slots Parallelism at a time: start-first reserves the new task
// as Next and promotes it once it runs; stop-first vacates the slot (an
// empty Task supersedes the old task, which stops), waits for it to stop,
// then places the new one. A slot counts against Parallelism until its new
// task has run through the Monitor period, and batches start Delay apart.
// A new task that fails, turns unhealthy or crash-loops within the monitor
// period fails the update: FailureAction pause sets the service paused
// (repairs continue, the walk stops); rollback writes the previous spec
// back under a new version with state rolling-back, and the same walk takes
// every slot back. Because currency is by digest, the tasks that never
// left the old spec are current again and stay. When every slot runs the
// current version past its monitor period, the owner records converged and
// sets the state active.
//
// # For the executor
//
// Actions are idempotent given the state they act on: executing one twice,
// or executing a decision made on a slightly stale view, is safe. Executors
// should stop a task before releasing its reservation (AgentDecide does
// that order; Ledger.Expire exists for a backstop that stops the tasks it
// returns at once), rebuild the ledger with Ledger.Adopt from the tasks
// they find on restart, and keep a Reserve's slot in Snapshot.InFlight
// from the first call until the slot is written or the candidates run out.
package sched
