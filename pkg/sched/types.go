package sched

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/shoal-dev/shoal/pkg/crdt"
)

// Resources is an amount of CPU and memory: a node's capacity, a task's
// reservation, or what is free.
type Resources struct {
	CPUMillis   int64 `json:"cpu_millis"`
	MemoryBytes int64 `json:"memory_bytes"`
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{r.CPUMillis + o.CPUMillis, r.MemoryBytes + o.MemoryBytes}
}

// Sub returns r - o (which may be negative).
func (r Resources) Sub(o Resources) Resources {
	return Resources{r.CPUMillis - o.CPUMillis, r.MemoryBytes - o.MemoryBytes}
}

// Fits reports whether r fits in free.
func (r Resources) Fits(free Resources) bool {
	return r.CPUMillis <= free.CPUMillis && r.MemoryBytes <= free.MemoryBytes
}

func (r Resources) String() string {
	return fmt.Sprintf("cpu %s, memory %s", FormatCPU(r.CPUMillis), FormatBytes(r.MemoryBytes))
}

// FormatCPU renders millicores: 1500 → "1.5 CPU", 250 → "250m".
func FormatCPU(m int64) string {
	if m >= 1000 && m%100 == 0 {
		return strconv.FormatFloat(float64(m)/1000, 'f', -1, 64) + " CPU"
	}
	return strconv.FormatInt(m, 10) + "m"
}

// ParseBytes parses a size: a plain number of bytes, or a number
// with a unit: k/ki/kib, m/mi/mib, g/gi/gib (all binary, as Docker and
// Nomad read them), e.g. 512m, 1.5GiB.
func ParseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffixes []string
		mult     int64
	}{
		{[]string{"kib", "ki", "kb", "k"}, 1 << 10},
		{[]string{"mib", "mi", "mb", "m"}, 1 << 20},
		{[]string{"gib", "gi", "gb", "g"}, 1 << 30},
		{[]string{"tib", "ti", "tb", "t"}, 1 << 40},
		{[]string{"b"}, 1},
	} {
		found := false
		for _, suf := range u.suffixes {
			if strings.HasSuffix(t, suf) {
				t, mult, found = strings.TrimSuffix(t, suf), u.mult, true
				break
			}
		}
		if found {
			break
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("%q: want a size like 256m, 1.5GiB or 1048576", s)
	}
	return int64(f * float64(mult)), nil
}

// FormatBytes renders a byte count with a binary unit: "512MiB", "1.5GiB".
func FormatBytes(b int64) string {
	const unit = 1024
	if b < unit && b > -unit {
		return strconv.FormatInt(b, 10) + "B"
	}
	div, exp := int64(unit), 0
	for n := b / unit; (n >= unit || n <= -unit) && exp < 5; n /= unit {
		div *= unit
		exp++
	}
	s := strings.TrimSuffix(strconv.FormatFloat(float64(b)/float64(div), 'f', 1, 64), ".0")
	return s + string("KMGTPE"[exp]) + "iB"
}

// Availability is whether a node takes new tasks.
type Availability string

// Node availabilities.
const (
	// Active nodes take new tasks.
	Active Availability = "active"
	// Drain: no new tasks; owners move existing ones elsewhere
	// (replacement first, then the old task stops).
	Drain Availability = "drain"
	// Pause: no new tasks, restarts and replacements included; the
	// tasks there keep running (Swarm's pause).
	Pause Availability = "pause"
)

// Node is what the scheduler knows of a node: its /nodes/<id> document and
// whether this observer's membership view says it is alive. Nodes that
// have left the cluster are not Nodes at all: leave them out of snapshots.
type Node struct {
	ID       string
	Name     string
	Hostname string
	Labels   map[string]string
	// Alive is the observer's liveness view (statd membership): two
	// observers may disagree for a while.
	Alive        bool
	Availability Availability
	Capacity     Resources
	// ShutDown: the node's scheduler said its machine is shutting down
	// and stopped its tasks (see Up), and has not started since.
	ShutDown bool
	// SpecFields are the spec fields beyond the baseline its schedd knows
	// (NodeSpecFieldsField); none for a schedd from before they were
	// published.
	SpecFields map[string]bool
}

// TaskState is a task's lifecycle state, written by the node running it.
type TaskState string

// Task states. pending → starting → running, then exited, failed or stopped
// (terminal); restarting while a container waits out its backoff before an
// in-place restart; unhealthy when its health check failed (it is stopped
// and its owner replaces it).
const (
	TaskPending    TaskState = "pending"
	TaskStarting   TaskState = "starting"
	TaskRunning    TaskState = "running"
	TaskRestarting TaskState = "restarting"
	TaskUnhealthy  TaskState = "unhealthy"
	TaskExited     TaskState = "exited"
	TaskFailed     TaskState = "failed"
	TaskStopped    TaskState = "stopped"
)

// Terminal reports whether s is final: the node will not run the task
// again. (An unhealthy task is final too: it is stopped, never restarted.)
func (s TaskState) Terminal() bool {
	switch s {
	case TaskExited, TaskFailed, TaskStopped, TaskUnhealthy:
		return true
	}
	return false
}

// Health is a task's health-check status.
type Health string

// Health statuses; "" when the service has no health check.
const (
	HealthNone      Health = ""
	HealthStarting  Health = "starting"
	HealthHealthy   Health = "healthy"
	HealthUnhealthy Health = "unhealthy"
)

// Task is a /tasks/<id> document: written only by the node that runs it.
type Task struct {
	ID      string
	Service string
	Slot    string
	Node    string
	// Version is the service version the task was created for;
	// SpecDigest identifies the spec it runs (ServiceSpec.Digest).
	Version    int64
	SpecDigest string
	State      TaskState
	Health     Health
	// Restarts counts restarts of the slot: in-place restarts plus the
	// count inherited from the task this one replaced (Inherited, 0 in
	// documents from before the field).
	Restarts  int
	Inherited int
	// RestartTimes are when the slot's restarts within its policy's
	// window were made (RestartPolicy.Window; none without one).
	RestartTimes []time.Time
	ExitCode     int
	Error        string
	// Created is the stamp of the node's first write of the document:
	// HLC time plus node ID. The supersession rule compares it with the
	// slot document's stamp.
	Created crdt.Stamp
	// Started is when the container last started (zero if never);
	// Finished when it last exited or was marked unhealthy.
	Started, Finished time.Time
	Resources         Resources
	// Ports are the host-mode ports the task binds on its node.
	Ports []Port
	Image string
	// Claim names the task of a slot write that replaced this one as
	// lost while its container was in fact running (a partition, not a
	// death); ClaimedAt is when its node said so. The owner then gives
	// the slot to the older of the two (see Slot.Lost).
	Claim     string
	ClaimedAt time.Time
	// SupersededAt is the time (HLC wall clock) of the slot write for
	// which the task's node stopped it, set with the stop. An owner
	// whose copy of the slot is older has not got that write yet: gossip
	// brought the task's document first, and the write it lacks already
	// decided the slot.
	SupersededAt time.Time
}

// CreatedAt is the wall time of Created.
func (t Task) CreatedAt() time.Time { return t.Created.TS.Time() }

// Slot is a /slots/<service>/<slot> document, written only by the
// service's owner. It names the task that fills the slot and, while a
// replacement starts next to a still-running task (start-first updates,
// drains), the replacement in Next. A slot whose Task is empty is vacant:
// every task of the slot created before the document was written is
// superseded.
type Slot struct {
	Service string
	Slot    string
	Task    string
	Node    string
	Version int64

	Next        string
	NextNode    string
	NextVersion int64

	// Lost is the task this write replaced because its node was seen
	// down. Should that task still run (its node was cut off, not dead),
	// its node keeps it and claims the slot back rather than stopping it.
	Lost string

	// Fresh marks a write by an owner that knew no document of the slot
	// and no task of it. A task the slot named may still run where that
	// owner could not see it (a partition that began before the slot's
	// first documents reached it): such a task claims the slot back as a
	// lost one does.
	Fresh bool

	// Stamp is the stamp of the last write of the document.
	Stamp crdt.Stamp
}

// Names reports whether the slot document names task id (as its task or
// as the replacement being started).
func (s Slot) Names(id string) bool { return id != "" && (s.Task == id || s.Next == id) }

// ServiceState is the state of a service document.
type ServiceState string

// Service states.
const (
	ServiceActive      ServiceState = "active"
	ServicePaused      ServiceState = "paused"
	ServiceRollingBack ServiceState = "rolling-back"
)

// Service is a /services/<name> document.
type Service struct {
	Name string
	Spec ServiceSpec
	// Version increases by one on every update (and on a rollback).
	Version int64
	// PrevSpec is the spec before the last update (nil if none): a
	// rollback makes it the spec again.
	PrevSpec *ServiceSpec
	State    ServiceState
	// Converged is the last version whose rollout completed: every slot
	// ran it past the monitor period (written by the owner). A rollout is
	// in progress while Converged < Version.
	Converged int64
	// Run is the scheduled time of a scheduled job's last run, and
	// RunVersion the version its owner wrote with it (0: it has not run
	// yet): a slot whose task is of an older version runs again.
	Run        time.Time
	RunVersion int64
	// RunSlots is a replicated scheduled job's replica count at its last
	// run (0: global, or written before the field existed): slots beyond
	// it, added by a scale-up since, wait for the next run.
	RunSlots int64
	// RunNodes are the nodes a global scheduled job's last run ran on
	// (empty: replicated, or written before the field existed): a node
	// that became eligible since waits for the next run.
	RunNodes []string
	Updated  time.Time
	// Created is the stamp of the create's write (zero for a service
	// written before the field existed): the older of two services
	// publishing one port keeps it (netd).
	Created crdt.Stamp
}

// IsReplicaSlot reports whether slot is a replica number ("0", "1", …) and
// returns it.
func IsReplicaSlot(slot string) (int, bool) {
	n, err := strconv.Atoi(slot)
	if err != nil || n < 0 || strconv.Itoa(n) != slot {
		return 0, false
	}
	return n, true
}

// NextRun is when a scheduled job runs next: the first time its schedule
// names after its last run, or after its creation if it has not run yet
// (zero if the service has no schedule, or it names no time).
func (s *Service) NextRun() time.Time {
	sch, err := ParseSchedule(s.Spec.Schedule)
	if s.Spec.Schedule == "" || err != nil {
		return time.Time{}
	}
	return s.nextRun(sch)
}

func (s *Service) nextRun(sch cron.Schedule) time.Time {
	base := s.Run
	if s.RunVersion == 0 {
		base = s.Updated
		if s.Created.TS.Wall != 0 {
			base = s.Created.TS.Time()
		}
	}
	return sch.Next(base.UTC())
}
