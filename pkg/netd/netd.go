// Package netd wires shoal-netd: the WireGuard overlay between nodes, a
// network namespace per task, service DNS and published ports
// (docs/NETWORKING.md).
//
// The data path never runs through netd itself: packets go through the
// kernel (veths, the node bridge, routes) and the WireGuard device, which
// in userspace mode lives in a holder process that outlives netd. So a
// netd restart drops no connection; it re-adopts the holder by its UAPI
// socket and re-reads its state (key, subnet, address allocations) from
// disk. What netd does itself — DNS and the published-port proxy — is back
// within a second of a restart.
package netd

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/spf13/pflag"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/dns"
	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/portproxy"
	"github.com/shoal-dev/shoal/pkg/wg"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
)

// Config is shoal-netd's configuration (/etc/shoal/netd.toml).
type Config struct {
	daemon.Common
	// WGPort is the WireGuard UDP port.
	WGPort int `toml:"wg_port"`
	// Bridge is the node bridge tasks attach to.
	Bridge string `toml:"bridge"`
	// DNSPort is where the service DNS listens on the bridge address.
	DNSPort int `toml:"dns_port"`
	// Upstreams are resolvers for names outside .shoal (default: those
	// of /etc/resolv.conf).
	Upstreams []string `toml:"upstreams"`
	// HolderExe is the binary run as the WireGuard holder (default: this
	// one).
	HolderExe string `toml:"holder_exe"`
}

// DefaultOverlay is the overlay CIDR when the cluster sets none.
const DefaultOverlay = "10.42.0.0/16"

// Spec describes shoal-netd to the daemon runtime.
func Spec() daemon.Spec {
	return daemon.Spec{
		Name:  "netd",
		Short: "Shoal network daemon: WireGuard overlay, task networks, service DNS, published ports",
		Long: `shoal-netd joins this node to the cluster's WireGuard mesh (kernel
WireGuard, or userspace wireguard-go in a holder process that outlives
netd), claims the node's /24 of the overlay, gives every task a network
namespace on the node bridge, answers <service>.shoal in DNS and forwards
published ports to healthy replicas anywhere. It serves shoal.net.v1 on
<run-dir>/netd.sock and needs shoal-statd on the same node.`,
		MetricsPort: 9463,
		Config: func(c daemon.Common) daemon.Configurable {
			return &Config{Common: c, WGPort: 51820, Bridge: "shoal0", DNSPort: 53}
		},
		Flags: func(fs *pflag.FlagSet, cfg any) {
			c := cfg.(*Config)
			fs.IntVar(&c.WGPort, "wg-port", c.WGPort, "WireGuard UDP port")
			fs.StringVar(&c.Bridge, "bridge", c.Bridge, "node bridge for task networks")
			fs.IntVar(&c.DNSPort, "dns-port", c.DNSPort, "service DNS port on the bridge address")
			fs.StringSliceVar(&c.Upstreams, "upstream", c.Upstreams, "upstream resolvers (default: /etc/resolv.conf)")
			fs.StringVar(&c.HolderExe, "holder-exe", c.HolderExe, "binary run as the WireGuard holder (default: this one)")
		},
		Start: start,
	}
}

// Main runs shoal-netd; `shoal-netd wg-holder` runs the WireGuard holder.
func Main(args []string) int {
	if len(args) > 0 && args[0] == "wg-holder" {
		return wg.HolderMain(args[1:])
	}
	return daemon.Main(Spec(), args)
}

// node is one netd.
type node struct {
	cfg   *Config
	log   *slog.Logger
	statd *client.Statd

	id        string
	advertise netip.Addr
	mirror    *client.Mirror
	ready     chan struct{}

	key     wgtypes.Key
	iface   string
	mode    string
	mtu     int
	dev     *wg.Device
	nl      *wg.Netlink
	overlay netip.Prefix
	subnet  atomic.Pointer[netip.Prefix]

	dns   *dns.Server
	proxy *portproxy.Proxy

	mu   sync.Mutex // guards ipam, sealing and attach/detach
	ipam *overlay.IPAM
	// sealing are this node's tasks sealed at their attach (on internal
	// networks only) whose documents have not arrived: isolationOf
	// cannot tell yet, and a reconcile meanwhile must not unseal them.
	sealing map[netip.Addr]bool

	// pubs are the published ports as the run loop last applied them
	// (written by it only, under pubMu; Status reads them).
	pubMu sync.Mutex
	pubs  map[portKey]*publication

	// scope is what service DNS names each task sees (set before the
	// DNS server starts, replaced by every reconcile).
	scope atomic.Pointer[dnsScope]

	// nft holds the isolation rules' netlink socket, opened in the
	// node's namespace; iso is what the run loop last applied (under
	// isoMu; Status reads it), applied reports whether it did yet.
	nft     *nftables.Conn
	isoMu   sync.Mutex
	iso     isolation
	applied bool
}

func start(ctx context.Context, rt *daemon.Runtime) (func(context.Context) error, error) {
	cfg := rt.Config.(*Config)
	if cfg.HolderExe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.HolderExe = exe
	}
	for _, d := range []string{"resolv"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	st, err := client.NewStatd(cfg.RunDir, client.Retry{})
	if err != nil {
		return nil, err
	}
	n := &node{cfg: cfg, log: rt.Log, statd: st, ready: make(chan struct{})}
	netv1.RegisterNetworkServer(rt.GRPC, &api{n: n})
	rt.Details = n.details
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := n.run(runCtx); err != nil && runCtx.Err() == nil {
			rt.Fatal(err)
		}
	}()
	return func(context.Context) error {
		cancel()
		wg.Wait()
		n.close()
		return st.Close()
	}, nil
}

func (n *node) isReady() bool {
	select {
	case <-n.ready:
		return true
	default:
		return false
	}
}

// details is netd's part of `shoalctl daemon status`: the overlay as this
// node runs it. The fields read are set before ready is closed.
func (n *node) details() map[string]string {
	if !n.isReady() {
		return map[string]string{"state": "waiting for the node to be in a cluster, or bringing the overlay up"}
	}
	out := map[string]string{"node_id": n.id, "interface": n.iface, "wireguard": n.mode, "mtu": fmt.Sprint(n.mtu)}
	if sub := n.subnet.Load(); sub != nil {
		out["subnet"] = sub.String()
	}
	n.pubMu.Lock()
	out["published_ports"] = fmt.Sprint(len(n.pubs))
	n.pubMu.Unlock()
	return out
}

var errNotReady = fmt.Errorf("this node's network is not ready: is it in a cluster (`shoalctl cluster status`)? %w", errUnavailable)

// close releases what netd holds itself; the WireGuard holder, the bridge
// and the task namespaces stay, on purpose.
func (n *node) close() {
	if n.dns != nil {
		n.dns.Close()
	}
	if n.proxy != nil {
		n.proxy.Close()
	}
	if n.dev != nil {
		n.dev.Close()
	}
	if n.nl != nil {
		n.nl.Close()
	}
}
