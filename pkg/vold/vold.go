// Package vold wires shoal-vold: replicated volumes, each its own Raft
// group on the multi-Raft host of pkg/raftgroup, and on the cluster's
// system group a replicated key-value store with locks and the named state
// machines of other processes.
//
// # Pieces
//
// Every node runs the same daemon. It gets the node's certificate and the
// cluster CA from statd (Cluster.Identity), follows statd's membership,
// and serves VolPeer on TCP (peer_port, 7472) with mutual TLS: the Raft
// transport (transport.go: per destination node, bounded queues drained by
// goroutines holding one stream each, so the host never waits on the
// network) and forwarded requests (forward.go) from nodes that hold no
// replica of a group.
//
// A volume is a statd document (/volumes/<name>, volume.go) that names its
// group and members. Any node creates one: it places the replicas on the
// live nodes that host the fewest, writes the document and waits for the
// group to elect a leader. Every vold watches the documents and creates,
// joins or destroys its replicas to match (reconcile.go); a replica the
// document dropped retires first, and goes once its group no longer
// needs its vote (raftgroup's retiring.go). The leader of
// each group replaces members whose node has been dead for replace_after
// (repair.go): the new member goes into the document first, so that its
// node joins empty, then a joint-consensus change swaps it for the dead
// one, then the document drops the dead one.
//
// The system group (volume "_system", created on first use by the lowest
// live node) runs raftgroup's typed state machine with a compare-and-swap
// key-value applier (kv.go) and raftgroup's locks; its API is KV on
// vold.sock. The same applier keeps the logs of named state machines
// (machines.go) that processes outside vold drive through StateMachines:
// Set appends an opaque command once a quorum applied it, Watch streams
// the log for the process to fold — its Use(applier).
//
// # Node IDs
//
// Raft names hosts by number; Shoal by hex string. nodeid.go maps one to
// the other by parsing the hex (see there).
package vold

import (
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/spf13/pflag"

	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/fdhold"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// Config is shoal-vold's configuration (/etc/shoal/vold.toml).
type Config struct {
	daemon.Common
	// PeerPort is the TCP port of VolPeer (Raft and forwarding) on the
	// node's advertise address. Nodes publish theirs in /nodes/<id>.
	PeerPort uint32 `toml:"peer_port"`
	// ReplaceAfter is how long a member's node must have been dead (in
	// statd's view) before the group's leader replaces it; a member whose
	// vold alone is silent on a live node is replaced after twice that.
	ReplaceAfter daemon.Duration `toml:"replace_after"`
	// RepairInterval is how often leaders check their members.
	RepairInterval daemon.Duration `toml:"repair_interval"`
	// VolumeLevel is the highest volume level (volfs.MaxLevel; level.go)
	// this vold lets volumes it holds replicas of reach: it publishes
	// this, and raises no volume above it. 0 is volfs.MaxLevel. Pinned
	// lower during a rolling upgrade, it keeps volumes at the old
	// semantics until the operator no longer needs to downgrade.
	VolumeLevel uint32 `toml:"volume_level"`
	// CreateTimeout bounds how long CreateVolume waits for the new group.
	CreateTimeout daemon.Duration `toml:"create_timeout"`
	// Capacity caps the bytes of volumes this node takes (0: the free
	// space of the state dir's file system). Volume sizes are reserved
	// whole against it when replicas are placed.
	Capacity int64 `toml:"capacity_bytes"`
	// RaftTick is the Raft host's tick (elections take 10 ticks). Every
	// node of a cluster should use the same.
	RaftTick daemon.Duration `toml:"raft_tick"`
	// FollowWriters hands a volume's leadership (and the system group's)
	// to the node whose replica proposes most of its writes, a hop
	// shorter for each of them (raftgroup Config.FollowProposers). Off,
	// leadership moves only when a leader is lost.
	FollowWriters bool `toml:"follow_writers"`
	// HandOffTimeout bounds how long a stopping vold spends handing the
	// leadership of the groups it leads to other replicas, so that their
	// writes wait for one election round rather than an election timeout
	// (raftgroup Host.HandOff); 0 stops without.
	HandOffTimeout daemon.Duration `toml:"handoff_timeout"`
	// MountDir holds the FUSE mounts of volumes (default
	// <state-dir>/mounts).
	MountDir string `toml:"mount_dir"`
	// KeepMounts hands each mount's FUSE session to a holder process, so
	// that mounts outlive a vold restart (see fuse.go).
	KeepMounts bool `toml:"keep_mounts"`
	// MaxProcs is the Go scheduler's processor count (GOMAXPROCS) of the
	// shoal-vold binary; 0 picks one for each four CPUs, at least one,
	// unless the GOMAXPROCS environment variable is set. See maxProcs.
	MaxProcs int `toml:"max_procs"`
	// HugePages advises transparent huge pages for the shoal-vold
	// process's heap (pkg/hugeheap): fewer page faults as volumes' data
	// grows in memory, for an RSS committed in 2 MiB steps.
	HugePages bool `toml:"huge_pages"`
	// HeapReserveMiB is heap memory the shoal-vold process makes resident
	// at start and keeps (pkg/hugeheap.Reserve), so that writes into
	// volumes reuse mapped pages instead of faulting in fresh ones; its
	// cost is that much RSS from the start. -1 (the default) picks 1 GiB
	// or a sixteenth of the memory (the machine's, or the memory cgroup's
	// limit if lower), whichever is less, and none when GOMEMLIMIT is set;
	// 0 turns it off.
	HeapReserveMiB int `toml:"heap_reserve_mib"`
}

// Spec describes shoal-vold to the daemon runtime.
func Spec() daemon.Spec {
	return daemon.Spec{
		Name:  "vold",
		Short: "Shoal volume daemon: replicated volumes on multi-Raft, KV and locks",
		Long: `shoal-vold hosts replicated volumes: each volume is one Raft group (etcd
raft, many groups per process, one Pebble log) with R replicas placed on
the live nodes that hold the fewest. Its filesystem is mounted with FUSE
on the nodes that use it, every change a Raft proposal. When a replica's
node has been dead for --replace-after, the group's leader replaces it on
another node (joint consensus). The cluster's system group serves a
linearizable key-value store with compare-and-swap and locks with
fencing tokens.

It serves shoal.vol.v1 Volumes and KV on <run-dir>/vold.sock, speaks
VolPeer (Raft transport, forwarded requests) with the other nodes' vold on
TCP --peer-port over mutual TLS, and needs shoal-statd on the same node
for the cluster identity, membership and volume documents (/volumes/...).`,
		MetricsPort: 9464,
		Config: func(c daemon.Common) daemon.Configurable {
			return &Config{
				Common:         c,
				PeerPort:       DefaultPeerPort,
				ReplaceAfter:   daemon.Duration(30 * time.Second),
				RepairInterval: daemon.Duration(2 * time.Second),
				CreateTimeout:  daemon.Duration(30 * time.Second),
				RaftTick:       daemon.Duration(100 * time.Millisecond),
				FollowWriters:  true,
				HandOffTimeout: daemon.Duration(2 * time.Second),
				KeepMounts:     true,
				HugePages:      true,
				HeapReserveMiB: -1,
			}
		},
		Flags: func(fs *pflag.FlagSet, cfg any) {
			c := cfg.(*Config)
			fs.Uint32Var(&c.PeerPort, "peer-port", c.PeerPort, "TCP port of the vold peer API (Raft transport, forwarding)")
			fs.Var(&c.ReplaceAfter, "replace-after", "replace a volume replica whose node has been dead this long (whose vold alone has been silent twice this long)")
			fs.Var(&c.RepairInterval, "repair-interval", "how often group leaders check their members")
			fs.Uint32Var(&c.VolumeLevel, "volume-level", c.VolumeLevel, fmt.Sprintf("highest volume level (1-%d) volumes with a replica here may be raised to; pin it to the old one during an upgrade to keep a downgrade possible (0: %d)", volfs.MaxLevel, volfs.MaxLevel))
			fs.Var(&c.CreateTimeout, "create-timeout", "how long volume create waits for the new group to elect a leader")
			fs.Int64Var(&c.Capacity, "capacity-bytes", c.Capacity, "bytes of volumes this node may host (0: the free space of the state dir)")
			fs.Var(&c.RaftTick, "raft-tick", "Raft tick (election timeout is 10 ticks); the same on every node")
			fs.BoolVar(&c.FollowWriters, "follow-writers", c.FollowWriters, "move a volume's Raft leadership to the node that writes most of it (a hop shorter per write)")
			fs.Var(&c.HandOffTimeout, "handoff-timeout", "at stop, hand the leadership of the volumes this node leads to other replicas for up to this long (0: stop without)")
			fs.StringVar(&c.MountDir, "mount-dir", c.MountDir, "directory of the volumes' FUSE mounts (default <state-dir>/mounts)")
			fs.BoolVar(&c.KeepMounts, "keep-mounts", c.KeepMounts, "keep volume mounts alive across vold restarts (a holder process keeps their FUSE sessions)")
			fs.BoolVar(&c.HugePages, "huge-pages", c.HugePages, "ask the kernel for transparent huge pages for vold's heap (fewer page faults as volume data grows in memory)")
			fs.IntVar(&c.HeapReserveMiB, "heap-reserve-mib", c.HeapReserveMiB, "MiB of heap made resident at start and kept, so that volume writes reuse mapped memory (-1: 1024 or a sixteenth of the machine's memory, whichever is less; 0: none)")
			fs.IntVar(&c.MaxProcs, "max-procs", c.MaxProcs, "processors the Go scheduler runs vold's goroutines on (0: one per four CPUs, at least one, unless GOMAXPROCS is set)")
		},
		Start: start,
	}
}

// Main runs shoal-vold.
func Main(args []string) int {
	if len(args) > 0 && args[0] == fdhold.Command {
		return fdhold.Main(args[1:])
	}
	if exe, err := os.Executable(); err == nil {
		holderExe = exe
		reexecWithGODEBUG(exe)
	}
	ownProcess = true
	return daemon.Main(Spec(), args)
}

var errNotReady = fmt.Errorf("this node's vold is not ready: is the node in a cluster (`shoalctl cluster status`)? %w", errdefs.ErrUnavailable)

func (c *Config) check() error {
	if c.PeerPort == 0 || c.PeerPort > 65535 {
		return fmt.Errorf("peer_port %d: want 1-65535", c.PeerPort)
	}
	if c.HeapReserveMiB < -1 {
		return fmt.Errorf("heap_reserve_mib %d: want -1 (automatic), 0 (none) or more", c.HeapReserveMiB)
	}
	if c.VolumeLevel > volfs.MaxLevel {
		return fmt.Errorf("volume_level %d: this vold knows levels 1-%d (0: %d)", c.VolumeLevel, volfs.MaxLevel, volfs.MaxLevel)
	}
	if c.MaxProcs < 0 {
		return fmt.Errorf("max_procs %d: want 0 (automatic) or more", c.MaxProcs)
	}
	if c.HandOffTimeout < 0 {
		return fmt.Errorf("handoff_timeout %v: want 0 (none) or more", time.Duration(c.HandOffTimeout))
	}
	if c.ReplaceAfter <= 0 || c.RepairInterval <= 0 || c.CreateTimeout <= 0 || c.RaftTick <= 0 {
		return fmt.Errorf("replace_after, repair_interval, create_timeout and raft_tick must be positive")
	}
	return nil
}
