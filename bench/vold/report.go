package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
)

// Goals.
const (
	seqGoal      = 0.5             // volume sequential MB/s ≥ this × local
	randGoal     = 0.3             // volume random-write IOPS ≥ this × local
	failoverGoal = 3 * time.Second // writes acknowledged again within this
)

func (r *results) print(c config) {
	fmt.Printf("Machine: %s. Cluster %s: %d nodes on %s, each a network namespace on a bridge running the real shoal-statd and shoal-vold (%s) with default settings (Raft tick 100 ms, elections after 10 ticks, replace-after 30 s), formed by `shoalctl cluster init` and `join` (devcluster.Up took %v). Everything below is driven from the host through each node's vold socket (pkg/client), as shoalctl would; file I/O goes from the host through the FUSE mount a node's vold made (Mount returns its host path). The nodes' state and the local-filesystem baseline share one filesystem (%s). The CPU of other processes during each phase is the machine's busy time less this benchmark and its cluster (%s).\n\n",
		machine(), r.name, nodes, r.subnet, orDash(r.version), r.up.Round(100*time.Millisecond), r.fs, acctNote(r.acctExact))
	r.printSeq(c)
	r.printRand(c)
	r.printReads(c)
	r.printFailover(c)
	r.printRestarts(c)
	r.printKV(c)
	r.printIdle(c)
}

func acctNote(exact bool) string {
	if exact {
		return "counted exactly through a cpuacct cgroup holding this process and every daemon it started"
	}
	return "approximate: no cpuacct cgroup, so the daemons' CPU counts as other processes"
}

func (r *results) printSeq(c config) {
	s := r.seq
	fmt.Printf("### Sequential writes into a %d-replica volume\n\n", c.replicas)
	fmt.Printf("A %d MiB file created, written in 1 MiB `write` calls and fsynced, then closed and deleted, timed from the open to the end of the close; MB/s is 10⁶ bytes per second. Four targets, %d rounds interleaved (the order rotating): a plain directory on the local filesystem, the same with three writers at once, and the volume's FUSE mount on the group leader's node (node %d) and on node %d, %s. The volume has %s and a %d MiB size limit; vold mounts with direct I/O, so each 1 MiB `write` is one Raft proposal acknowledged once committed on a quorum and applied, and a single writer never has two in flight (fsync then has nothing left to do).\n\n",
		c.seqMiB, c.reps, s.leader, s.follower, secondMount(c), replicasText(c.replicas), volumeSize>>20)
	fmt.Printf("| written to | MB/s per round | median MB/s | time per 1 MiB write | CPU per MiB | Raft MiB sent per MiB | leadership transfers / snapshots | × local | × each of three local writers |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	local, local3 := median(s.mbps[rowLocal]), median(s.mbps[rowLocal3])
	ok := true
	for _, row := range s.rows {
		xs := s.mbps[row]
		var parts []string
		for _, x := range xs {
			parts = append(parts, fmt.Sprintf("%.1f", x))
		}
		m := median(xs)
		rat, rat3 := "–", "–"
		if isVolume(row) {
			rat, rat3 = fmt.Sprintf("%.2f×", m/local), fmt.Sprintf("%.2f×", m/local3)
			ok = ok && m/local >= seqGoal
		}
		per := time.Duration(float64(chunk) / (m * 1e6) * float64(time.Second))
		cpu := medianDur(s.cpu[row]) / time.Duration(c.seqMiB)
		sent, moved := "–", "–"
		if isVolume(row) && len(s.sentPerMiB[row]) > 0 {
			sent, moved = fmt.Sprintf("%.2f", median(s.sentPerMiB[row])), fmt.Sprintf("%d / %d", s.transfers[row], s.snapshots[row])
		}
		fmt.Printf("| %s | %s | %.1f | %s | %s | %s | %s | %s | %s |\n", row, strings.Join(parts, ", "), m, dur(per), dur(cpu), sent, moved, rat, rat3)
	}
	fmt.Printf("\n%s\n\n*CPU per MiB* is the median over the rounds of the CPU time this benchmark's writer and the whole cluster (every node's statd and vold) used during a round, per MiB written (kernel writeback threads are not counted, for either target). *Raft MiB sent per MiB*: the median over the rounds of what the three volds sent each other in Raft batches (shoal_vold_raft_bytes_sent_total), per MiB written: 2 when the leader sends each write to two followers, 3 when a follower's write also goes to the leader first. *Leadership transfers / snapshots*: those the volds made and took during the row's rounds, all rounds together (shoal_vold_raft_leader_transfers_total, shoal_vold_raft_snapshots_taken_total; a volume's snapshot is its whole filesystem, written to a file while the writes go on). Leadership: %s Meanwhile %s. **Goal ≥ %.1f× local (both mounts): %s** (leader's node %.2f×, follower's node %.2f×).\n\n",
		threeWritersNote, s.led.note(s.follower), s.load, seqGoal, metStr(ok), median(s.mbps[rowLeader])/local, median(s.mbps[rowFollower])/local)
}

// secondMount says what the node of the second volume mount is: with a
// single replica there is no follower, and the mount on a node without a
// replica forwards to the leader (rows keep their "follower's node"
// label).
func secondMount(c config) string {
	if c.replicas == 1 {
		return "a node that holds no replica (the rows labelled a follower's node)"
	}
	return "a follower's node"
}

func replicasText(n int) string {
	if n == 1 {
		return "1 replica"
	}
	return fmt.Sprintf("%d replicas on %d nodes", n, n)
}

// threeWritersNote says what the three-writer rows are for.
const threeWritersNote = "*Three local writers at once* write a file each, as the three replicas of a volume on this machine's one disk must (every replica writes the data and syncs it): the row gives what each of them got, the ceiling of a volume here whatever its software costs. The goal is measured against one local writer."

// slowWrite is the latency from which the random-write table counts a
// write as slow (its "time in writes over" column).
const slowWrite = 2 * time.Millisecond

// slowWriteNote says what that column shows.
const slowWriteNote = "*Time in writes over 2 ms*: the share of the writers' time spent in writes that took longer, over all runs. This machine's disk (a VM's) stalls for several milliseconds about every 100 ms while several processes sync at once, which a single writer rarely meets: the local rows show what that costs writers who share the disk, as a volume's three replicas here do (docs/VOLUMES.md)."

func isVolume(row string) bool { return row == rowLeader || row == rowFollower }

func (r *results) printRand(c config) {
	s := r.rnd
	fmt.Printf("### Synchronous random 4 KiB writes\n\n")
	fmt.Printf("One thread writing 4 KiB blocks (`pwrite`) at random 4 KiB-aligned offsets of a preallocated %d MiB file opened with O_DSYNC, for %v per run, %d runs per target interleaved as above (three writers at once write a file each); the same targets (the volume mounted on node %d, the leader's, and node %d, %s). Latency is per write, over all runs. On the local filesystem each write waits for the disk (this is the disk's synchronous write rate, the context of the KV figures below); in the volume each write is a Raft proposal committed on a quorum (each replica's log write is a record synced in its raft journal) and applied; the mount answers FSYNC with ENOSYS, so O_DSYNC costs no second round trip.\n\n",
		c.randMiB, c.randDur, c.reps, s.leader, s.follower, secondMount(c))
	ok := s.printTable()
	iops, local := s.medianIOPS, s.medianIOPS(rowLocal)
	fmt.Printf("\n%s IOPS are per writer.\n\n%s\n\n*CPU per write* is the median over the runs of the CPU time of the writer and the whole cluster during a run, per write. *Journal syncs / Raft rounds per write*: the medians over the runs of the three volds' synced journal writes and Raft loop rounds together (shoal_vold_raft_syncs_total, shoal_vold_raft_rounds_total) per write; three syncs per write means none was shared. %s %s Leadership: %s Meanwhile %s. **Goal ≥ %.1f× local (both mounts): %s** (leader's node %.2f×, follower's node %.2f×).\n\n",
		threeWritersNote, slowWriteNote, s.snapshotNote(), s.timeNote(), s.led.note(s.follower), s.load, randGoal, metStr(ok), iops(rowLeader)/local, iops(rowFollower)/local)
	r.printRandMany(c)
	r.printPolled(c)
}

// printTable prints the single-writer rows of the 4 KiB table and reports
// whether both mounts met the goal.
func (s randResult) printTable() bool {
	fmt.Printf("| written to | IOPS per run | median IOPS | p50 | p99 | max | time in writes over %d ms | CPU per write | journal syncs / Raft rounds per write | × local | × each of three local writers |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", slowWrite.Milliseconds())
	iops := s.medianIOPS
	local, local3 := iops(rowLocal), iops(rowLocal3)
	ok := true
	for _, row := range s.rows {
		if row == rowLocalMany || row == rowLeaderMany {
			continue // printRandMany
		}
		sum := s.summary(row)
		m := iops(row)
		rat, rat3 := "–", "–"
		if isVolume(row) {
			rat, rat3 = fmt.Sprintf("%.2f×", m/local), fmt.Sprintf("%.2f×", m/local3)
			ok = ok && m/local >= randGoal
		}
		var worst time.Duration
		if len(sum.lat) > 0 {
			worst = slices.Max(sum.lat)
		}
		fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %.1f%% | %s | %s | %s | %s |\n", sum.name, sum.perRun, m, dur(pctl(sum.lat, 0.5)), dur(pctl(sum.lat, 0.99)), dur(worst), 100*slowShare(sum.lat, slowWrite), dur(sum.cpu), s.raftPerWrite(row), rat, rat3)
	}
	return ok
}

// printPolled prints the second pass of the 4 KiB rows (haltpoll.go).
func (r *results) printPolled(c config) {
	p := r.rndPolled
	if p == nil {
		return
	}
	s := p.rnd
	fmt.Printf("#### The same with the kernel's default guest halt polling\n\n")
	fmt.Printf("This machine is a KVM guest whose cpuidle driver is haltpoll, booted with its guest halt polling at %d ns (`%s`): an idle vCPU halts into the host at once, and waking it costs more than a wake-up of a vCPU that polls. A write through a volume waits idle several times on its way (a follower for the append and for its sync, the leader for the acknowledgement, the writer for FUSE's answer), a local synchronous write once. The single-writer rows again, the same way, with the setting at the kernel's default, %d ns, for this pass only (put back afterwards): the local baseline and the volume both measured with it. Shoal sets nothing of the kind; the goal is judged on the table above, as the machine runs.\n\n",
		p.was, haltPollParam, p.ns)
	ok := s.printTable()
	local := s.medianIOPS(rowLocal)
	fmt.Printf("\n%s %s Leadership: %s Meanwhile %s. **With halt polling at %d ns, ≥ %.1f× local (both mounts): %s** (leader's node %.2f×, follower's node %.2f×; as booted %.2f× and %.2f×).\n\n",
		s.snapshotNote(), s.timeNote(), s.led.note(s.follower), s.load, p.ns, randGoal, metStr(ok), s.medianIOPS(rowLeader)/local, s.medianIOPS(rowFollower)/local,
		r.rnd.medianIOPS(rowLeader)/r.localIOPS(), r.rnd.medianIOPS(rowFollower)/r.localIOPS())
}

// medianIOPS is a row's median IOPS over its runs.
func (s randResult) medianIOPS(row string) float64 {
	var xs []float64
	for _, x := range s.runs[row] {
		xs = append(xs, x.iops())
	}
	return median(xs)
}

// rowSummary is what both random-write tables print of a row's runs.
type rowSummary struct {
	name   string          // the row, with its failed writes if any
	perRun string          // IOPS of each run
	lat    []time.Duration // of every write of every run
	cpu    time.Duration   // median CPU per write
}

func (s randResult) summary(row string) rowSummary {
	var parts []string
	var cpus []time.Duration
	sum := rowSummary{name: row}
	errs := 0
	for _, x := range s.runs[row] {
		parts = append(parts, fmt.Sprintf("%.0f", x.iops()))
		sum.lat = append(sum.lat, x.lat...)
		cpus = append(cpus, x.cpuPerWrite())
		errs += x.errs
	}
	if errs > 0 {
		sum.name += fmt.Sprintf(" (%d failed writes)", errs)
	}
	sum.perRun, sum.cpu = strings.Join(parts, ", "), medianDur(cpus)
	return sum
}

// raftPerWrite is a volume row's journal syncs and Raft rounds per write
// (medians over its runs), "–" for the local filesystem.
func (s randResult) raftPerWrite(row string) string {
	var syncs, rounds []float64
	for _, x := range s.runs[row] {
		if x.rounds > 0 {
			syncs, rounds = append(syncs, x.syncs), append(rounds, x.rounds)
		}
	}
	if len(rounds) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f / %.2f", median(syncs), median(rounds))
}

// snapshotNote says how many snapshots the volds took during the
// single-writer volume runs (shoal_vold_raft_snapshots_taken_total) and
// the longest write of runs with one against that of the others: a
// volume's snapshot is forked on the Raft loop and written off it, but
// the disk still takes it, and each page is copied on its first write
// after the fork.
func (s randResult) snapshotNote() string {
	var taken uint64
	var with, runs int
	var worstWith, worstWithout time.Duration
	for _, row := range []string{rowLeader, rowFollower} {
		for _, x := range s.runs[row] {
			if len(x.lat) == 0 {
				continue
			}
			runs++
			worst := slices.Max(x.lat)
			if x.snapshots > 0 {
				taken += x.snapshots
				with++
				worstWith = max(worstWith, worst)
			} else {
				worstWithout = max(worstWithout, worst)
			}
		}
	}
	if taken == 0 {
		return "The volds took no snapshot during the single-writer volume runs (shoal_vold_raft_snapshots_taken_total)."
	}
	return fmt.Sprintf("The volds took %d snapshots during the single-writer volume runs (shoal_vold_raft_snapshots_taken_total), in %d of %d runs; a volume's snapshot is forked on the Raft loop and written off it, to a file its node's disk takes while the journals sync: the longest write of those runs took %s, of the others %s.", taken, with, runs, dur(worstWith), dur(worstWithout))
}

// timeNote says where the single-writer volume rows' writes spent their
// time, from the volds' histograms summed over each row's runs: the
// filesystem mutations as the mount's vold timed them (from its
// filesystem layer taking the request to the answer: forwarding,
// proposal, commit, apply), and every node's synced journal writes. What
// a write's latency holds beyond its mutation is FUSE and the kernel.
func (s randResult) timeNote() string {
	var parts []string
	for _, row := range []string{rowLeader, rowFollower} {
		mutate, syncs := hist{}, []hist{}
		node := s.leader
		if row == rowFollower {
			node = s.follower
		}
		for _, x := range s.runs[row] {
			mutate.add(x.mutateTime)
			for i, h := range x.syncTime {
				if i == len(syncs) {
					syncs = append(syncs, hist{})
				}
				syncs[i].add(h)
			}
		}
		if mutate.count() == 0 {
			continue
		}
		var sp []string
		for _, h := range syncs {
			sp = append(sp, dur(h.quantile(0.5)))
		}
		parts = append(parts, fmt.Sprintf("through node %d's mount (%s), its vold answered the mutations in %s (p50; p99 %s) and the synced journal writes of nodes 1 / 2 / 3 took %s (p50s)",
			node, strings.TrimPrefix(row, "volume, "), dur(mutate.quantile(0.5)), dur(mutate.quantile(0.99)), strings.Join(sp, " / ")))
	}
	if len(parts) == 0 {
		return ""
	}
	return "*Where the time goes* (the volds' histograms over each row's runs, `shoal_vold_fs_op_seconds{kind=\"mutate\"}` from the filesystem layer taking a request to its answer, `shoal_vold_raft_sync_seconds`): " + strings.Join(parts, "; ") + "; the rest of a write's latency is FUSE and the kernel's."
}

// printRandMany prints the several-writer rows: not the goal's measure
// (one writer), but what a database with concurrent commits gets.
func (r *results) printRandMany(c config) {
	s := r.rnd
	if len(s.runs[rowLeaderMany]) == 0 {
		return
	}
	fmt.Printf("The same with %d writers at once, each writing its own file in the same way (the local files, and %d files in the volume through the leader's mount), in the same interleaved runs. IOPS are those of all writers together. Not the goal's measure, which is one writer: what a service with concurrent synchronous writers (a database's commits) gets, since the leader commits together whatever is pending — one journal record and sync per replica and one message per follower — where each local writer's write waits for its own sync.\n\n", c.randWriters, c.randWriters)
	fmt.Printf("| written to | IOPS per run | median IOPS | p50 | p99 | CPU per write | journal syncs / Raft rounds per write | × local, same writers |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
	local := s.medianIOPS(rowLocalMany)
	for _, row := range []string{rowLocalMany, rowLeaderMany} {
		sum := s.summary(row)
		m := s.medianIOPS(row)
		rat := "–"
		if row == rowLeaderMany && local > 0 {
			rat = fmt.Sprintf("%.2f×", m/local)
		}
		fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %s | %s |\n", sum.name, sum.perRun, m, dur(pctl(sum.lat, 0.5)), dur(pctl(sum.lat, 0.99)), dur(sum.cpu), s.raftPerWrite(row), rat)
	}
	fmt.Printf("\n")
}

func (r *results) printFailover(c config) {
	if len(r.fo) == 0 {
		return
	}
	fmt.Printf("### Leader failover under writes\n\n")
	fmt.Printf("A writer on the host appends 10-byte lines, one `write` at a time, to a file opened with O_APPEND through the volume's mount on a follower's node. Once it has made 20 writes, the leader's whole node is killed (devcluster Kill: SIGKILL to its statd and vold, so the mount stays up on the writer's node but the group loses its leader). *Writes again* is the time from the kill (just before devcluster Kill sends SIGKILL) until the acknowledgement of the first write begun after Kill returned (every process of the node gone: until then a write may still reach the old leader); *longest gap* is the longest time between two consecutive acknowledgements from the kill on (a write in flight at the kill waits for the new leader). The node is then started again (devcluster Start, until its daemons serve) and timed until InspectVolume reports every member alive and caught up. Each cycle starts with the volume healthy and %v of quiet.\n\n", c.settle)
	fmt.Printf("| cycle | leader killed | writer | new leader | Kill took | **writes again** | longest gap | failed writes | restart until serving | healthy again (from restart) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var rec []time.Duration
	allOK := true
	for k, f := range r.fo {
		w := dur(f.recovered)
		if !f.ok {
			w, allOK = "> "+dur(c.timeout), false
		}
		h := dur(f.healthy)
		if !f.healthyOK {
			h = "> " + dur(c.timeout)
		}
		nl := "–"
		if f.newLeader != 0 {
			nl = fmt.Sprint(f.newLeader)
		}
		fmt.Printf("| %d | %d | %d | %s | %s | %s | %s | %d | %s | %s |\n", k+1, f.leader, f.writer, nl, dur(f.killTook), w, dur(f.stall), f.failed, dur(f.restart), h)
		rec = append(rec, f.recovered)
	}
	worst := slices.Max(rec)
	fmt.Printf("\nWrites again: median %s, worst %s (%s). Meanwhile %s. **Goal ≤ %.0f s: %s.**\n\n",
		dur(medianDur(rec)), dur(worst), durList(rec), r.foLoad, failoverGoal.Seconds(), metStr(allOK && worst <= failoverGoal))
}

func (r *results) printKV(c config) {
	if len(r.kv) == 0 {
		return
	}
	fmt.Printf("### KV Put and state machine Set\n\n")
	fmt.Printf("Clients on the host, each in a loop of Put calls (a 100-byte value; each client overwrites its own key), spread over the three nodes' vold sockets, for %v per run. Every node holds a replica of the system group, so vold runs each Put on the local replica (no VolPeer forwarding: *forwarded* counts shoal_vold_forwarded_out_total) and Raft forwards the proposal to the leader when the local replica follows; a Put returns once a quorum has applied it. The system group's leader is on node %d; a single client uses a follower's node. Baseline in the same run: statd's Put on the same nodes' statd sockets with the same clients, a durable local write (Pebble, synced) that is not replicated before it returns. Context: the disk's synchronous 4 KiB write rate above (local filesystem, O_DSYNC) is %.0f per second.\n\n",
		c.kvDur, r.kvLeader, r.localIOPS())
	fmt.Printf("| clients (node 1 / 2 / 3) | API | puts/s | p50 | p99 | max | errors | puts served by node 1 / 2 / 3 | vold forwarded | × statd puts/s | other CPU |\n|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
	for _, k := range r.kv {
		cn := fmt.Sprintf("%d (%d / %d / %d)", k.clients, k.clientNodes[0], k.clientNodes[1], k.clientNodes[2])
		row := func(api string, x kvRun, fwd string, rat string) {
			var worst time.Duration
			if len(x.lat) > 0 {
				worst = slices.Max(x.lat)
			}
			fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %d | %d / %d / %d | %s | %s | %.2f |\n", cn, api, x.rate(), dur(pctl(x.lat, 0.5)), dur(pctl(x.lat, 0.99)), dur(worst), x.errs,
				x.perNode[0], x.perNode[1], x.perNode[2], fwd, rat, x.load.Others())
		}
		row("statd Put (baseline)", k.statd, "–", "–")
		fwd := 0.0
		for _, f := range k.vold.fwdOut {
			fwd += f
		}
		row("**vold KV Put**", k.vold, fmt.Sprintf("%.0f", fwd), fmt.Sprintf("%.2f×", k.vold.rate()/k.statd.rate()))
		if len(k.machines.lat) > 0 || k.machines.errs > 0 {
			row("**vold state machine Set**", k.machines, "–", fmt.Sprintf("%.2f×", k.machines.rate()/k.statd.rate()))
		}
	}
	fmt.Printf("\n*State machine Set* is the StateMachines API's Set on the same sockets with the same clients: a 100-byte command (a protobuf Any) appended to a named machine's log (one machine per client), returning once a quorum has applied it; its *puts/s* are Sets. No goal is set for these APIs; *other CPU* is the CPUs other processes used during the run.\n\n")
}

func (r *results) localIOPS() float64 { return r.rnd.medianIOPS(rowLocal) }

// reserveText says what heap each vold reserved (MiB per node).
func reserveText(mib []float64) string {
	if len(mib) == 0 {
		return "not reported"
	}
	if slices.Min(mib) == slices.Max(mib) {
		if mib[0] == 0 {
			return "none"
		}
		return fmt.Sprintf("%.0f MiB", mib[0])
	}
	parts := make([]string, len(mib))
	for i, v := range mib {
		parts[i] = fmt.Sprintf("%.0f", v)
	}
	return strings.Join(parts, " / ") + " MiB"
}

func (r *results) printIdle(c config) {
	fmt.Printf("### Idle cost of volumes\n\n")
	a, z := r.idle0, r.idleN
	fmt.Printf("CPU time of each node's vold (utime + stime from /proc/<pid>/stat) over %v as %% of one core, and its VmRSS at the end, with no client activity. Baseline: right after the cluster formed, with no volume (not even the KV system group). Then, after the other phases (the bench volume removed), %d volumes of 3 replicas and 1 MiB are created through the three nodes' sockets in turn, %d calls at a time, and once every vold has used under %.0f%% of a core over 3 s (waited %s%s) the same is measured; the KV system group exists by then too. *Groups* are the Raft groups each vold holds a replica of, and leads (its metrics); the Go heap in use (after the measurement, less the heap reserve's ballast, which is never touched) is the part of the RSS the groups' state, caches and requests can take, Pebble's memtables and block cache included (vold is built without cgo, so Pebble allocates them in the Go heap); the rest is the heap reserve (vold's heap_reserve_mib, %s here, resident from the start so that volume writes reuse mapped pages) and memory the Go runtime has not returned to the kernel yet, filled by the write phases. *Go collections* counts each vold's garbage collections from the start of the volumes' creation to the end of the window (go_gc_duration_seconds_count): the heap reserve's ballast keeps them rare, so the garbage of the write phases stays in the heap (in use) until one runs; *heap returned* is what the Go runtime's scavenger gave back to the kernel during the window (go_memstats_heap_released_bytes). statd's figures are for context: it stores and watches the volume documents. One tick (10 ms) over %v is %.2f%% of a core.\n\n",
		a.window.Round(10*time.Millisecond), z.volumes, c.createPar, idleGoal, dur(z.quiesceWait), map[bool]string{true: "", false: ": never got there, measured anyway"}[z.quiesced],
		reserveText(a.reserveMiB), a.window.Round(10*time.Millisecond), 1.0/cpuacct.ClockTicks/a.window.Seconds()*100)
	if z.volumes > 0 {
		cr := r.create
		fmt.Printf("Creating: %d volumes in %s (%.1f per second), CreateVolume p50 %s, p99 %s; %d failed%s. Meanwhile %s.\n\n",
			cr.n-cr.failed, dur(cr.elapsed), float64(cr.n-cr.failed)/cr.elapsed.Seconds(), dur(pctl(cr.lat, 0.5)), dur(pctl(cr.lat, 0.99)), cr.failed,
			map[bool]string{true: "", false: " (first: " + cr.firstErr + ")"}[cr.firstErr == ""], cr.load)
	}
	fmt.Printf("| node | vold CPU, no volume | vold RSS, no volume | **vold CPU, %d volumes** (Go collections; heap returned) | vold RSS (Go heap in use), %d volumes | groups (leading), %d volumes | statd CPU, none / %d | statd RSS, none / %d |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
		z.volumes, z.volumes, z.volumes, z.volumes, z.volumes)
	worst := 0.0
	for i := range nodes {
		zc, zr, g, sc, sr := "–", "–", "–", fmt.Sprintf("%.2f%% / –", a.statd[i].cpu), fmt.Sprintf("%.0f / – MiB", a.statd[i].rssMB)
		if z.volumes > 0 && i < len(z.vold) {
			zc, zr = fmt.Sprintf("%.2f%%", z.vold[i].cpu), fmt.Sprintf("%.0f MiB", z.vold[i].rssMB)
			if i < len(z.heapMiB) {
				zr = fmt.Sprintf("%.0f MiB (%.0f)", z.vold[i].rssMB, z.heapMiB[i])
			}
			if i < len(z.gcs) && z.gcs[i] >= 0 {
				zc += fmt.Sprintf(" (%.0f; %.0f MiB)", z.gcs[i], z.releasedMiB[i])
			}
			if i < len(z.groups) {
				g = fmt.Sprintf("%.0f (%.0f)", z.groups[i], z.leading[i])
			}
			sc = fmt.Sprintf("%.2f%% / %.2f%%", a.statd[i].cpu, z.statd[i].cpu)
			sr = fmt.Sprintf("%.0f / %.0f MiB", a.statd[i].rssMB, z.statd[i].rssMB)
			worst = max(worst, z.vold[i].cpu)
		}
		fmt.Printf("| %d | %.2f%% | %.0f MiB | %s | %s | %s | %s | %s |\n", i+1, a.vold[i].cpu, a.vold[i].rssMB, zc, zr, g, sc, sr)
	}
	fmt.Printf("\nOther processes used %.2f CPUs during the baseline window and %.2f during the measurement with volumes.", a.load.Others(), z.load.Others())
	if z.volumes > 0 {
		var rss0, rssN []float64
		for i := range nodes {
			rss0, rssN = append(rss0, a.vold[i].rssMB), append(rssN, z.vold[i].rssMB)
		}
		if len(z.awake) == nodes {
			fmt.Printf(" Groups still awake (not quiesced) %.0f / %.0f / %.0f, log entries cached in memory %.1f / %.1f / %.1f MiB.",
				z.awake[0], z.awake[1], z.awake[2], z.cacheMiB[0], z.cacheMiB[1], z.cacheMiB[2])
		}
		fmt.Printf(" %d idle volumes add %.0f MiB of RSS per vold (median; %.0f KiB per replica). **Goal ≤ %.0f%% of one core per node with %d volumes: %s** (worst node %.2f%%).",
			z.volumes, median(rssN)-median(rss0), (median(rssN)-median(rss0))*1024/float64(z.volumes), idleGoal, z.volumes, metStr(worst <= idleGoal), worst)
	}
	fmt.Printf("\n\n")
}
