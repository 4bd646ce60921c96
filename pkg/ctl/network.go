package ctl

import (
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/client"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
)

func (a *app) networkCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "network", Short: "Inspect the overlay network"}
	var format string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "The overlay and every node's subnet",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := a.netStatus(cmd, format)
			if err != nil {
				return err
			}
			subs := st.GetSubnets()
			sort.Slice(subs, func(i, j int) bool { return subs[i].GetSubnet() < subs[j].GetSubnet() })
			return render(a.out, format, st, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "OVERLAY\t%s\nTHIS NODE\t%s (%s, %s WireGuard, MTU %d)\nDNS\t%s\n\n", st.GetOverlayCidr(), st.GetNodeId(), st.GetSubnet(), st.GetMode(), st.GetMtu(), st.GetDns())
				fmt.Fprintln(tw, "SUBNET\tNODE")
				for _, s := range subs {
					fmt.Fprintf(tw, "%s\t%s\n", s.GetSubnet(), s.GetNode())
				}
			})
		},
	}
	outputFlag(ls, &format)
	var iformat string
	inspect := &cobra.Command{
		Use:   "inspect",
		Short: "This node's WireGuard peers: endpoints, last handshake, bytes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := a.netStatus(cmd, iformat)
			if err != nil {
				return err
			}
			return render(a.out, iformat, st, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "INTERFACE\t%s (%s)\nPUBLIC KEY\t%s\nTASKS\t%d\nPUBLISHED\t%v\n\n", st.GetInterface(), st.GetMode(), st.GetPublicKey(), st.GetTasks(), st.GetPublished())
				fmt.Fprintln(tw, "PEER\tSUBNET\tENDPOINT\tLAST HANDSHAKE\tRECEIVED\tSENT")
				for _, p := range st.GetPeers() {
					hs := "never"
					if p.GetLastHandshake() != nil {
						hs = time.Since(p.GetLastHandshake().AsTime()).Round(time.Second).String() + " ago"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.GetNode(), p.GetSubnet(), p.GetEndpoint(), hs, bytesText(uint64(p.GetRxBytes())), bytesText(uint64(p.GetTxBytes())))
				}
			})
		},
	}
	outputFlag(inspect, &iformat)
	cmd.AddCommand(ls, inspect)
	return cmd
}

func (a *app) netStatus(cmd *cobra.Command, format string) (*netv1.StatusResponse, error) {
	if err := checkFormat(format); err != nil {
		return nil, err
	}
	c, err := client.NewNetd(a.runDir, client.Retry{})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := a.ctx(cmd)
	defer cancel()
	return c.Status(ctx, &netv1.StatusRequest{})
}
