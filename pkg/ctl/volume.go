package ctl

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/sched"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// volumeView is a volume as shoalctl prints it (JSON and YAML too).
type volumeView struct {
	Name      string        `json:"name"`
	Group     uint64        `json:"group"`
	Replicas  int32         `json:"replicas"`
	SizeBytes int64         `json:"size_bytes"`
	UsedBytes int64         `json:"used_bytes"`
	HeldFiles uint64        `json:"held_files"`
	Level     uint32        `json:"level,omitempty"`
	Health    string        `json:"health"`
	Leader    string        `json:"leader"`
	Commit    uint64        `json:"commit"`
	Created   string        `json:"created"`
	Members   []replicaView `json:"members"`
	MountedOn []string      `json:"mounted_on,omitempty"`
	UsedBy    []string      `json:"used_by,omitempty"`
}

type replicaView struct {
	Node    string `json:"node"`
	Replica uint64 `json:"replica"`
	Role    string `json:"role"`
	Applied uint64 `json:"applied"`
	Lag     uint64 `json:"lag"`
	Alive   bool   `json:"alive"`
	Digest  string `json:"digest,omitempty"`
	// VoldLevel is the level the member's vold lets volumes reach
	// (inspect only; 0 when it does not answer).
	VoldLevel uint32 `json:"vold_level,omitempty"`
}

func viewVolume(v *volv1.Volume) volumeView {
	out := volumeView{
		Name: v.GetName(), Group: v.GetGroup(), Replicas: v.GetReplicas(), SizeBytes: v.GetSizeBytes(),
		UsedBytes: v.GetUsedBytes(), HeldFiles: v.GetHeldFiles(), Level: v.GetLevel(), Health: v.GetHealth(), Leader: v.GetLeader(), Commit: v.GetCommit(),
		MountedOn: v.GetMountedOn(), UsedBy: v.GetUsedBy(), Members: []replicaView{},
	}
	if v.GetCreated() != nil {
		out.Created = v.GetCreated().AsTime().UTC().Format(time.RFC3339)
	}
	for _, m := range v.GetMembers() {
		out.Members = append(out.Members, replicaView{
			Node: m.GetNode(), Replica: m.GetReplica(), Role: m.GetRole(), Applied: m.GetApplied(),
			Lag: m.GetLag(), Alive: m.GetAlive(), Digest: m.GetDigest(), VoldLevel: m.GetVoldLevel(),
		})
	}
	return out
}

// voldCall returns a vold client and a context bounded by --timeout; done
// releases both.
func (a *app) voldCall(cmd *cobra.Command) (*client.Vold, context.Context, func(), error) {
	c, err := client.NewVold(a.runDir, client.Retry{})
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := a.ctx(cmd)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

func (a *app) volumeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "Replicated volumes (one Raft group each)"}

	var (
		replicas int32
		size     string
		cformat  string
	)
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume and wait until its replicas have elected a leader",
		Long: `Create a replicated volume. Its R replicas (default 3, at most the live
nodes) go on the live nodes that hold the fewest replicas, passing over
nodes whose vold does not answer unless there are too few others. Two
replicas survive no failure (a quorum of two is both): prefer 1, 3 or 5.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(cformat); err != nil {
				return err
			}
			var sizeBytes int64
			if size != "" {
				b, err := sched.ParseBytes(size)
				if err != nil {
					return usageError{fmt.Errorf("--size: %w", err)}
				}
				sizeBytes = b
			}
			if cmd.Flags().Changed("replicas") && replicas < 1 {
				return usageError{fmt.Errorf("--replicas %d: a volume needs at least one replica", replicas)}
			}
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			v, err := c.Volumes.CreateVolume(ctx, &volv1.CreateVolumeRequest{Name: args[0], Replicas: replicas, SizeBytes: sizeBytes})
			if err != nil {
				return err
			}
			if got := int32(v.GetReplicas()); replicas > got {
				// Capped by vold (one replica per node): say so, or the
				// user believes in a redundancy the volume lacks.
				fmt.Fprintf(a.errOut, "warning: volume %s has %d replicas, not the %d asked for: only %d live nodes could take one (at most one replica per node)\n",
					v.GetName(), got, replicas, got)
			}
			for _, w := range unreachableReplicas(v) {
				fmt.Fprintf(a.errOut, "warning: %s\n", w)
			}
			return a.renderVolume(cformat, v)
		},
	}
	create.Flags().Int32Var(&replicas, "replicas", 0, "number of replicas (default 3, capped by the live nodes)")
	create.Flags().StringVar(&size, "size", "", "size limit, e.g. 64Mi or 1G (default 1GiB)")
	outputFlag(create, &cformat)

	var (
		lformat  string
		lfilters []string
	)
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List volumes with their health and leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(lformat); err != nil {
				return err
			}
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Volumes.ListVolumes(ctx, &volv1.ListVolumesRequest{})
			if err != nil {
				return err
			}
			views := []volumeView{}
			for _, v := range resp.GetVolumes() {
				views = append(views, viewVolume(v))
			}
			if views, err = applyFilter(lfilters, volumeFilters, views); err != nil {
				return err
			}
			return render(a.out, lformat, views, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NAME\tREPLICAS\tSIZE\tUSED\tHEALTH\tLEADER\tMEMBERS")
				for _, v := range views {
					var nodes []string
					for _, m := range v.Members {
						nodes = append(nodes, m.Node)
					}
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.Replicas, bytesText(uint64(v.SizeBytes)), bytesText(uint64(v.UsedBytes)), v.Health, dash(v.Leader), strings.Join(nodes, ","))
				}
			})
		},
	}
	outputFlag(ls, &lformat)
	quietFlag(ls, &lformat, "Name")
	filterFlag(ls, &lfilters, volumeFilters)

	var (
		iformat string
		digests bool
	)
	inspect := &cobra.Command{
		Use:   "inspect NAME",
		Short: "A volume with the live status of every replica",
		Long: `A volume with the live status of every replica: role, applied index,
lag behind the leader's commit, and whether it answers. With --digests,
also a SHA-256 of each replica's whole state: equal digests at equal
applied indexes mean identical replicas. Every replica then hashes all
of its data (once per change: asking again about an idle volume hashes
nothing), which on a large busy volume costs seconds of CPU per call.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(iformat); err != nil {
				return err
			}
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			v, err := c.Volumes.InspectVolume(ctx, &volv1.InspectVolumeRequest{Name: args[0], Digests: digests})
			if err != nil {
				return err
			}
			return a.renderVolume(iformat, v)
		},
	}
	outputFlag(inspect, &iformat)
	inspect.Flags().BoolVar(&digests, "digests", false, "also show a SHA-256 of each replica's whole state (every replica hashes all its data)")

	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove volumes and their data (refused while a task uses one)",
		Long: `Remove each volume named, and print its name once removed. A volume that
cannot be removed (in use, missing) is reported and the others are still
removed; the exit status is then that of the first failure.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			return a.eachName(args, func(name string) error {
				if _, err := c.Volumes.RemoveVolume(ctx, &volv1.RemoveVolumeRequest{Name: name}); err != nil {
					return err
				}
				fmt.Fprintln(a.out, name)
				return nil
			})
		},
	}
	var user string
	mount := &cobra.Command{
		Use:   "mount NAME",
		Short: "Mount a volume on this node for --user and print the host path",
		Long: `Mount a volume on this node (once, whatever the number of users) and
register --user as using it, so that "volume rm" refuses to remove it.
Tasks get their volumes mounted by schedd; this is for operators and
tests.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Volumes.Mount(ctx, &volv1.MountRequest{Name: args[0], User: user})
			if err != nil {
				return err
			}
			fmt.Fprintln(a.out, resp.GetPath())
			return nil
		},
	}
	mount.Flags().StringVar(&user, "user", "shoalctl", "who uses the mount")
	unmount := &cobra.Command{
		Use:   "unmount NAME",
		Short: "Drop --user's use of a volume on this node (the last user unmounts it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			if _, err := c.Volumes.Unmount(ctx, &volv1.UnmountRequest{Name: args[0], User: user}); err != nil {
				return err
			}
			fmt.Fprintln(a.out, args[0])
			return nil
		},
	}
	unmount.Flags().StringVar(&user, "user", "shoalctl", "who used the mount")
	cmd.AddCommand(create, ls, inspect, a.volumeUpdateCommand(), rm, mount, unmount, a.volumeExport(), a.volumeImport())
	return cmd
}

func (a *app) renderVolume(format string, v *volv1.Volume) error {
	view := viewVolume(v)
	return render(a.out, format, view, func(tw *tabwriter.Writer) {
		fmt.Fprintf(tw, "NAME\t%s\nGROUP\t%d\nREPLICAS\t%d\nSIZE\t%s\nUSED\t%s\nHEALTH\t%s\nLEADER\t%s\nCOMMIT\t%d\nCREATED\t%s\n",
			view.Name, view.Group, view.Replicas, bytesText(uint64(view.SizeBytes)), bytesText(uint64(view.UsedBytes)),
			dash(view.Health), dash(view.Leader), view.Commit, view.Created)
		if view.Level > 0 {
			// Which semantics the replicas apply: an upgrade of vold
			// raises it once every member runs the new one.
			fmt.Fprintf(tw, "LEVEL\t%d%s\n", view.Level, levelNote(view))
		}
		if view.HeldFiles > 0 {
			// Their bytes are in USED: say why USED exceeds what ls shows.
			fmt.Fprintf(tw, "HELD OPEN\t%d unlinked files still open\n", view.HeldFiles)
		}
		if len(view.UsedBy) > 0 {
			fmt.Fprintf(tw, "MOUNTED ON\t%s\nUSED BY\t%s\n", strings.Join(view.MountedOn, ", "), strings.Join(view.UsedBy, ", "))
		}
		// The digest column only when they were asked for (--digests).
		digests := slices.ContainsFunc(view.Members, func(m replicaView) bool { return m.Digest != "" })
		// The volds' levels only where vold reported them (inspect).
		levels := slices.ContainsFunc(view.Members, func(m replicaView) bool { return m.VoldLevel > 0 })
		head := "\nNODE\tREPLICA\tROLE\tAPPLIED\tLAG\tALIVE"
		if levels {
			head += "\tVOLD LEVEL"
		}
		if digests {
			head += "\tDIGEST"
		}
		fmt.Fprintln(tw, head)
		for _, m := range view.Members {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%v", m.Node, m.Replica, dash(m.Role), m.Applied, m.Lag, m.Alive)
			if levels {
				fmt.Fprintf(tw, "\t%s", levelText(m.VoldLevel))
			}
			if digests {
				d := m.Digest
				if len(d) > 16 {
					d = d[:16]
				}
				fmt.Fprintf(tw, "\t%s", dash(d))
			}
			fmt.Fprintln(tw)
		}
	})
}

// levelNote says what holds a volume's level back when a member's vold
// lets a higher one: the members whose vold lets less or does not answer,
// or, when there are none, that the leader raises it (in its next repair
// round). Empty when nothing is held back.
func levelNote(view volumeView) string {
	var top uint32
	for _, m := range view.Members {
		top = max(top, m.VoldLevel)
	}
	if top <= view.Level {
		return ""
	}
	var held []string
	for _, m := range view.Members {
		switch {
		case m.VoldLevel == 0:
			held = append(held, fmt.Sprintf("node %s's vold does not answer", m.Node))
		case m.VoldLevel < top:
			held = append(held, fmt.Sprintf("node %s's vold lets %d", m.Node, m.VoldLevel))
		}
	}
	if len(held) == 0 {
		return fmt.Sprintf(" (every member's vold lets %d: the leader raises it)", top)
	}
	return fmt.Sprintf(" (%d once every member's vold lets it: %s)", top, strings.Join(held, "; "))
}

func levelText(l uint32) string {
	if l == 0 {
		return "-"
	}
	return fmt.Sprint(l)
}

// unreachableReplicas says which of a new volume's replicas did not
// answer: placed where no other node could take them (a vold restarting,
// say), they catch up when their vold is back.
func unreachableReplicas(v *volv1.Volume) []string {
	var out []string
	for _, m := range v.GetMembers() {
		if !m.GetAlive() {
			out = append(out, fmt.Sprintf("volume %s: replica %d on node %s does not answer; the volume is degraded until that node's vold is back (or the replica is replaced elsewhere)",
				v.GetName(), m.GetReplica(), m.GetNode()))
		}
	}
	return out
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// leaseView is a lease as shoalctl prints it.
type leaseView struct {
	Name    string `json:"name"`
	Holder  string `json:"holder"`
	Token   uint64 `json:"token"`
	Expires string `json:"expires"`
}

func viewLease(l *volv1.Lease) leaseView {
	v := leaseView{Name: l.GetName(), Holder: l.GetHolder(), Token: l.GetToken()}
	if l.GetExpires() != nil {
		v.Expires = l.GetExpires().AsTime().UTC().Format(time.RFC3339Nano)
	}
	return v
}

func defaultHolder() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "shoalctl"
	}
	return h
}

func (a *app) lockCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "lock", Short: "Cluster locks with fencing tokens (on vold's system group)"}
	var (
		holder string
		ttl    time.Duration
		token  uint64
	)
	acquire := &cobra.Command{
		Use:   "acquire NAME",
		Short: "Take a lock for --ttl and print its fencing token",
		Long: `Take a lock for --ttl and print its fencing token: the Raft log index of
the entry that granted it, so the tokens of successive holders strictly
increase. Acquiring a lock the holder already has extends it and keeps
its token. Fails (exit 1) while another holder has it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			l, err := c.KV.AcquireLock(ctx, &volv1.AcquireLockRequest{Name: args[0], Holder: holder, Ttl: durationpb.New(ttl)})
			if err != nil {
				return err
			}
			fmt.Fprintln(a.out, l.GetToken())
			return nil
		},
	}
	acquire.Flags().StringVar(&holder, "holder", defaultHolder(), "who holds the lock")
	acquire.Flags().DurationVar(&ttl, "ttl", 15*time.Second, "how long the lease lasts unless renewed")

	renew := &cobra.Command{
		Use:   "renew NAME --token T",
		Short: "Extend a held lock by --ttl",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			l, err := c.KV.RenewLock(ctx, &volv1.RenewLockRequest{Name: args[0], Holder: holder, Token: token, Ttl: durationpb.New(ttl)})
			if err != nil {
				return err
			}
			fmt.Fprintln(a.out, l.GetToken())
			return nil
		},
	}
	renew.Flags().StringVar(&holder, "holder", defaultHolder(), "who holds the lock")
	renew.Flags().Uint64Var(&token, "token", 0, "the lease's fencing token")
	renew.Flags().DurationVar(&ttl, "ttl", 15*time.Second, "new lease duration from now")
	_ = renew.MarkFlagRequired("token")

	release := &cobra.Command{
		Use:   "release NAME --token T",
		Short: "Release a held lock",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			if _, err := c.KV.ReleaseLock(ctx, &volv1.ReleaseLockRequest{Name: args[0], Holder: holder, Token: token}); err != nil {
				return err
			}
			fmt.Fprintln(a.out, args[0])
			return nil
		},
	}
	release.Flags().StringVar(&holder, "holder", defaultHolder(), "who holds the lock")
	release.Flags().Uint64Var(&token, "token", 0, "the lease's fencing token")
	_ = release.MarkFlagRequired("token")

	var format string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "Locks currently held",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.KV.ListLocks(ctx, &volv1.ListLocksRequest{})
			if err != nil {
				return err
			}
			views := []leaseView{}
			for _, l := range resp.GetLeases() {
				views = append(views, viewLease(l))
			}
			return render(a.out, format, views, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NAME\tHOLDER\tTOKEN\tEXPIRES")
				for _, l := range views {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", l.Name, l.Holder, l.Token, l.Expires)
				}
			})
		},
	}
	outputFlag(ls, &format)
	cmd.AddCommand(acquire, renew, release, ls)
	return cmd
}

// kvView is a key as shoalctl prints it.
type kvView struct {
	Key      string `json:"key"`
	Found    bool   `json:"found"`
	Value    string `json:"value"`
	Revision uint64 `json:"revision"`
}

func (a *app) kvCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "kv", Short: "The cluster's linearizable key-value store (on vold's system group)"}
	var ifRevision uint64
	put := &cobra.Command{
		Use:   "put KEY VALUE",
		Short: "Set a key and print its new revision",
		Long: `Set a key and print its new revision (the Raft log index of the write).
With --if-revision N the write applies only if the key's revision is N
(0: the key must not exist); otherwise it fails (exit 1) and says the
current revision.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			req := &volv1.PutRequest{Key: args[0], Value: []byte(args[1])}
			if cmd.Flags().Changed("if-revision") {
				req.Compare, req.ExpectRevision = true, ifRevision
			}
			resp, err := c.KV.Put(ctx, req)
			if err != nil {
				return err
			}
			if !resp.GetApplied() {
				return fmt.Errorf("key %q is at revision %d, not %d: nothing written", args[0], resp.GetRevision(), ifRevision)
			}
			fmt.Fprintln(a.out, resp.GetRevision())
			return nil
		},
	}
	put.Flags().Uint64Var(&ifRevision, "if-revision", 0, "write only if the key is at this revision (0: absent)")

	var format string
	get := &cobra.Command{
		Use:   "get KEY",
		Short: "Print a key's value (linearizable read)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.KV.Get(ctx, &volv1.GetRequest{Key: args[0]})
			if err != nil {
				return err
			}
			if !resp.GetFound() && format == "table" {
				return notFoundError{fmt.Errorf("key %q not found", args[0])}
			}
			if format == "table" {
				fmt.Fprintln(a.out, string(resp.GetValue()))
				return nil
			}
			v := kvView{Key: args[0], Found: resp.GetFound(), Value: string(resp.GetValue()), Revision: resp.GetRevision()}
			return render(a.out, format, v, nil)
		},
	}
	get.Flags().StringVarP(&format, "output", "o", "table", "output format: table (the value alone), json or yaml")
	cmd.AddCommand(put, get)
	return cmd
}
