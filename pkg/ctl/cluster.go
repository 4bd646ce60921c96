package ctl

import (
	"fmt"
	"math"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/sched"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
)

func (a *app) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Create, join and inspect the cluster"}
	cmd.AddCommand(a.clusterInit(), a.clusterJoin(), a.clusterToken(), a.clusterStatus(), a.clusterLeave())
	return cmd
}

func (a *app) clusterInit() *cobra.Command {
	var name, advertise, overlayCIDR string
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a new cluster with this node as its first member",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Cluster.Init(ctx, &clusterv1.InitRequest{ClusterName: name, AdvertiseAddr: advertise, OverlayCidr: overlayCIDR})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "Cluster %q created; this node is %s at %s.\n\n", resp.GetClusterName(), resp.GetNodeId(), resp.GetAdvertise())
			fmt.Fprintf(a.out, "To add a node, run on it:\n\n  shoalctl cluster join --token %s %s\n", resp.GetToken(), resp.GetAdvertise())
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "cluster-name", "shoal", "name of the new cluster")
	cmd.Flags().StringVar(&advertise, "advertise", "", "IP address other nodes reach this node at (default: detected)")
	cmd.Flags().StringVar(&overlayCIDR, "overlay-cidr", "10.42.0.0/16", "the task network; every node claims a /24 of it")
	return cmd
}

func (a *app) clusterJoin() *cobra.Command {
	var token, advertise string
	cmd := &cobra.Command{
		Use:   "join --token TOKEN ADDR[:PORT]",
		Short: "Join an existing cluster through any of its members",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if token == "" {
				return usageError{fmt.Errorf("--token is required (print one with `shoalctl cluster token` on a member)")}
			}
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Cluster.Join(ctx, &clusterv1.JoinRequest{Token: token, Addr: args[0], AdvertiseAddr: advertise})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "Joined cluster %q as %s at %s (%d members known).\n", resp.GetClusterName(), resp.GetNodeId(), resp.GetAdvertise(), resp.GetMembers())
			return nil
		},
	}
	cmd.Flags().StringVar(&token, "token", "", "join token from `shoalctl cluster token`")
	cmd.Flags().StringVar(&advertise, "advertise", "", "IP address other nodes reach this node at (default: the one that routes to ADDR)")
	return cmd
}

func (a *app) clusterToken() *cobra.Command {
	var rotate bool
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Print the join token (--rotate makes a new one and invalidates the old)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Cluster.Token(ctx, &clusterv1.TokenRequest{Rotate: rotate})
			if err != nil {
				return err
			}
			fmt.Fprintln(a.out, resp.GetToken())
			return nil
		},
	}
	cmd.Flags().BoolVar(&rotate, "rotate", false, "make a new token; the old one stops working")
	return cmd
}

func (a *app) clusterLeave() *cobra.Command {
	return &cobra.Command{
		Use:   "leave",
		Short: "Leave the cluster gracefully",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			if _, err := c.Cluster.Leave(ctx, &clusterv1.LeaveRequest{}); err != nil {
				return err
			}
			fmt.Fprintln(a.out, "Left the cluster.")
			return nil
		},
	}
}

// clusterStatusView is `cluster status -o json`.
type clusterStatusView struct {
	Cluster     string            `json:"cluster"`
	NodeID      string            `json:"node_id"`
	Advertise   string            `json:"advertise,omitempty"`
	Initialized bool              `json:"initialized"`
	RootHash    string            `json:"root_hash"`
	Keys        uint64            `json:"keys"`
	CertExpires *time.Time        `json:"cert_expires,omitempty"`
	Members     []memberView      `json:"members"`
	Counters    map[string]uint64 `json:"counters"`
}

type memberView struct {
	ID          string     `json:"id"`
	Addr        string     `json:"addr"`
	State       string     `json:"state"`
	Incarnation uint64     `json:"incarnation"`
	Since       time.Time  `json:"since"`
	Self        bool       `json:"self,omitempty"`
	Sync        *syncView  `json:"sync,omitempty"`
	LastSync    *time.Time `json:"last_sync,omitempty"`
}

type syncView struct {
	BytesSent       uint64 `json:"bytes_sent"`
	BytesReceived   uint64 `json:"bytes_received"`
	EntriesSent     uint64 `json:"entries_sent"`
	EntriesReceived uint64 `json:"entries_received"`
	Rounds          uint64 `json:"rounds"`
	Rejected        uint64 `json:"rejected"`
	LastError       string `json:"last_error,omitempty"`
}

func statusView(r *clusterv1.StatusResponse) clusterStatusView {
	v := clusterStatusView{
		Cluster: r.GetClusterName(), NodeID: r.GetNodeId(), Advertise: r.GetAdvertise(),
		Initialized: r.GetInitialized(), RootHash: r.GetRootHash(), Keys: r.GetKeys(),
		Counters: r.GetCounters(), Members: []memberView{},
	}
	if r.GetCertNotAfter() != nil {
		t := r.GetCertNotAfter().AsTime()
		v.CertExpires = &t
	}
	for _, m := range r.GetMembers() {
		mv := memberView{ID: m.GetId(), Addr: m.GetAddr(), State: m.GetState(), Incarnation: m.GetIncarnation(), Since: m.GetSince().AsTime(), Self: m.GetSelf()}
		if s := m.GetSync(); s != nil {
			mv.Sync = &syncView{BytesSent: s.GetBytesSent(), BytesReceived: s.GetBytesReceived(), EntriesSent: s.GetEntriesSent(),
				EntriesReceived: s.GetEntriesReceived(), Rounds: s.GetRounds(), Rejected: s.GetRejected(), LastError: s.GetLastError()}
			mv.LastSync = timeOf(s.GetLastSync())
		}
		v.Members = append(v.Members, mv)
	}
	sort.Slice(v.Members, func(i, j int) bool { return v.Members[i].ID < v.Members[j].ID })
	return v
}

func (a *app) clusterStatus() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "This node's view of the cluster: members, their state, sync",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Cluster.Status(ctx, &clusterv1.StatusRequest{})
			if err != nil {
				return err
			}
			v := statusView(resp)
			return render(a.out, format, v, func(tw *tabwriter.Writer) {
				if !v.Initialized {
					fmt.Fprintf(tw, "Node %s is not in a cluster (run `shoalctl cluster init` or `cluster join`).\n", v.NodeID)
					return
				}
				fmt.Fprintf(tw, "CLUSTER\t%s\nNODE\t%s (%s)\nROOT\t%s\nKEYS\t%d\n\n", v.Cluster, v.NodeID, v.Advertise, short(v.RootHash), v.Keys)
				fmt.Fprintln(tw, "MEMBER\tADDRESS\tSTATE\tSINCE\tLAST SYNC\tSENT\tRECEIVED\tREJECTED")
				for _, m := range v.Members {
					id := m.ID
					if m.Self {
						id += " (self)"
					}
					last, sent, recv, rej := "-", "-", "-", "-"
					if m.LastSync != nil {
						last = time.Since(*m.LastSync).Round(time.Millisecond).String() + " ago"
					}
					if m.Sync != nil {
						sent, recv, rej = bytesText(m.Sync.BytesSent), bytesText(m.Sync.BytesReceived), fmt.Sprint(m.Sync.Rejected)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", id, m.Addr, m.State, time.Since(m.Since).Round(time.Second), last, sent, recv, rej)
				}
			})
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func short(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return h
}

// bytesText shows a byte count in the largest binary unit under 1024 of
// it (64MiB, 1.5GiB), as the service commands show memory.
func bytesText(n uint64) string {
	if n > math.MaxInt64 {
		n = math.MaxInt64
	}
	return sched.FormatBytes(int64(n))
}
