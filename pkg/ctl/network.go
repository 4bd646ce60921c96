package ctl

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/client"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
)

// networkView is the overlay as this node's netd sees it, for -o json and
// yaml of both `network ls` and `network inspect`: every field always
// present, times in RFC 3339, lists never null.
type networkView struct {
	Node        string          `json:"node"`
	OverlayCIDR string          `json:"overlay_cidr"`
	Subnet      string          `json:"subnet"`
	Interface   string          `json:"interface"`
	Mode        string          `json:"mode"`
	PublicKey   string          `json:"public_key"`
	MTU         int32           `json:"mtu"`
	DNS         string          `json:"dns"`
	Tasks       uint32          `json:"tasks"`
	Subnets     []subnetView    `json:"subnets"`
	Peers       []peerView      `json:"peers"`
	Published   []publishedView `json:"published"`
	Networks    []overlayView   `json:"networks"`
}

type overlayView struct {
	Name      string      `json:"name"`
	Services  []string    `json:"services"`
	Addresses []string    `json:"addresses"`
	Aliases   []aliasView `json:"aliases"`
	Internal  bool        `json:"internal"`
}

type aliasView struct {
	Name    string `json:"name"`
	Service string `json:"service"`
}

type subnetView struct {
	Subnet string `json:"subnet"`
	Node   string `json:"node"`
}

type peerView struct {
	Node      string `json:"node"`
	PublicKey string `json:"public_key"`
	Endpoint  string `json:"endpoint"`
	Subnet    string `json:"subnet"`
	// LastHandshake is null until the first handshake.
	LastHandshake *time.Time `json:"last_handshake"`
	RxBytes       int64      `json:"rx_bytes"`
	TxBytes       int64      `json:"tx_bytes"`
}

type publishedView struct {
	Port        uint32   `json:"port"`
	Protocol    string   `json:"protocol"`
	Service     string   `json:"service"`
	Backends    []string `json:"backends"`
	Conflicting []string `json:"conflicting"`
	Bound       []string `json:"bound"`
	BindErrors  []string `json:"bind_errors"`
	Active      uint32   `json:"active"`
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func networkViewOf(st *netv1.StatusResponse) networkView {
	v := networkView{
		Node: st.GetNodeId(), OverlayCIDR: st.GetOverlayCidr(), Subnet: st.GetSubnet(), Interface: st.GetInterface(),
		Mode: st.GetMode(), PublicKey: st.GetPublicKey(), MTU: st.GetMtu(), DNS: st.GetDns(), Tasks: st.GetTasks(),
		Subnets: []subnetView{}, Peers: []peerView{}, Published: []publishedView{}, Networks: []overlayView{},
	}
	for _, n := range st.GetNetworks() {
		ov := overlayView{Name: n.GetName(), Services: nonNil(n.GetServices()), Addresses: nonNil(n.GetAddresses()), Aliases: []aliasView{},
			Internal: n.GetInternal()}
		for _, al := range n.GetAliases() {
			ov.Aliases = append(ov.Aliases, aliasView{Name: al.GetName(), Service: al.GetService()})
		}
		v.Networks = append(v.Networks, ov)
	}
	for _, s := range st.GetSubnets() {
		v.Subnets = append(v.Subnets, subnetView{Subnet: s.GetSubnet(), Node: s.GetNode()})
	}
	sort.Slice(v.Subnets, func(i, j int) bool { return v.Subnets[i].Subnet < v.Subnets[j].Subnet })
	for _, p := range st.GetPeers() {
		pv := peerView{Node: p.GetNode(), PublicKey: p.GetPublicKey(), Endpoint: p.GetEndpoint(), Subnet: p.GetSubnet(), RxBytes: p.GetRxBytes(), TxBytes: p.GetTxBytes()}
		if p.GetLastHandshake() != nil {
			t := p.GetLastHandshake().AsTime().UTC()
			pv.LastHandshake = &t
		}
		v.Peers = append(v.Peers, pv)
	}
	sort.Slice(v.Peers, func(i, j int) bool { return v.Peers[i].Node < v.Peers[j].Node })
	for _, p := range st.GetPublished() {
		v.Published = append(v.Published, publishedView{
			Port: p.GetPort(), Protocol: p.GetProtocol(), Service: p.GetService(), Backends: nonNil(p.GetBackends()),
			Conflicting: nonNil(p.GetConflicting()), Bound: nonNil(p.GetBound()), BindErrors: nonNil(p.GetBindErrors()), Active: p.GetActive(),
		})
	}
	return v
}

func (a *app) networkCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "network", Short: "Inspect the overlay and its networks"}
	var format string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "The overlay, every node's subnet, and the overlay networks services are on",
		Long: "The overlay, every node's subnet, and the overlay networks services are on (`service create --network NAME`; " +
			"a network exists while a service names it). -o json and yaml show everything `network inspect` shows too.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := a.netStatus(cmd, format)
			if err != nil {
				return err
			}
			return render(a.out, format, v, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "OVERLAY\t%s\nTHIS NODE\t%s (%s, %s WireGuard, MTU %d)\nDNS\t%s\n\n", v.OverlayCIDR, v.Node, v.Subnet, v.Mode, v.MTU, v.DNS)
				fmt.Fprintln(tw, "SUBNET\tNODE")
				for _, s := range v.Subnets {
					fmt.Fprintf(tw, "%s\t%s\n", s.Subnet, s.Node)
				}
				if len(v.Networks) == 0 {
					return
				}
				fmt.Fprintln(tw, "\nNETWORK\tTASKS\tSERVICES")
				for _, n := range v.Networks {
					fmt.Fprintf(tw, "%s\t%d\t%s\n", n.Name, len(n.Addresses), strings.Join(n.Services, ","))
				}
			})
		},
	}
	outputFlag(ls, &format)
	var iformat string
	inspect := &cobra.Command{
		Use:   "inspect [NETWORK]",
		Short: "This node's WireGuard peers (endpoints, last handshake, bytes) and published ports, or one overlay network's services and tasks",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := a.netStatus(cmd, iformat)
			if err != nil {
				return err
			}
			if len(args) == 1 {
				i := slices.IndexFunc(v.Networks, func(n overlayView) bool { return n.Name == args[0] })
				if i < 0 {
					return notFoundError{fmt.Errorf("network %s: no service is on it", args[0])}
				}
				n := v.Networks[i]
				return render(a.out, iformat, n, func(tw *tabwriter.Writer) {
					// One entry per name, with the services that share it.
					var aliases []string
					for i := 0; i < len(n.Aliases); {
						name, services := n.Aliases[i].Name, []string{}
						for ; i < len(n.Aliases) && n.Aliases[i].Name == name; i++ {
							services = append(services, n.Aliases[i].Service)
						}
						aliases = append(aliases, strings.TrimSuffix(name, ".")+" ("+strings.Join(services, ", ")+")")
					}
					internal := "no"
					if n.Internal {
						internal = "yes: its tasks on internal networks only reach nothing outside the overlay"
					}
					fmt.Fprintf(tw, "NETWORK\t%s\nINTERNAL\t%s\nSERVICES\t%s\nTASKS\t%s\nALIASES\t%s\n", n.Name, internal,
						strings.Join(n.Services, ", "), dash(strings.Join(n.Addresses, ", ")), dash(strings.Join(aliases, ", ")))
				})
			}
			return render(a.out, iformat, v, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "INTERFACE\t%s (%s)\nPUBLIC KEY\t%s\nTASKS\t%d\n\n", v.Interface, v.Mode, v.PublicKey, v.Tasks)
				fmt.Fprintln(tw, "PEER\tSUBNET\tENDPOINT\tLAST HANDSHAKE\tRECEIVED\tSENT")
				for _, p := range v.Peers {
					hs := "never"
					if p.LastHandshake != nil {
						hs = time.Since(*p.LastHandshake).Round(time.Second).String() + " ago"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Node, p.Subnet, p.Endpoint, hs, bytesText(uint64(p.RxBytes)), bytesText(uint64(p.TxBytes)))
				}
				if len(v.Published) == 0 {
					return
				}
				fmt.Fprintln(tw, "\nPUBLISHED\tSERVICE\tBACKENDS\tCONNECTIONS\tCONFLICTING")
				for _, p := range v.Published {
					fmt.Fprintf(tw, "%d/%s\t%s\t%s\t%d\t%s\n", p.Port, p.Protocol, p.Service, dash(strings.Join(p.Backends, ",")), p.Active, dash(strings.Join(p.Conflicting, ",")))
				}
			})
		},
	}
	outputFlag(inspect, &iformat)
	cmd.AddCommand(ls, inspect)
	return cmd
}

func (a *app) netStatus(cmd *cobra.Command, format string) (networkView, error) {
	if err := checkFormat(format); err != nil {
		return networkView{}, err
	}
	c, err := client.NewNetd(a.runDir, client.Retry{})
	if err != nil {
		return networkView{}, err
	}
	defer c.Close()
	ctx, cancel := a.ctx(cmd)
	defer cancel()
	st, err := c.Status(ctx, &netv1.StatusRequest{})
	if err != nil {
		return networkView{}, err
	}
	return networkViewOf(st), nil
}
