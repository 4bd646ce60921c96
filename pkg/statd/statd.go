// Package statd wires shoal-statd: the node's replicated state. It opens
// the document store (package store), serves the shoal.state.v1 API on the
// local socket, exports the store's counters as metrics and scrubs the
// index after start-up. Clustering (join, gossip, anti-entropy) plugs in
// here as further components over the same store.
//
// Deleted documents leave tombstones, collected after the tombstone
// retention (gc.go). A node away alone for longer gets no deleted
// document back; a group of nodes partitioned together for longer than
// the retention may, and a node away that long loses its own deletes of
// that time: gc.go states the limit exactly.
package statd

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/gossip"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/member"
	"github.com/shoal-dev/shoal/pkg/pki"
	"github.com/shoal-dev/shoal/pkg/store"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Config is shoal-statd's configuration (/etc/shoal/statd.toml).
type Config struct {
	daemon.Common
	// NodeID overrides the generated node ID on first start.
	NodeID string `toml:"node_id"`
	// MaxClockSkew bounds how far ahead of the local clock a peer's
	// timestamps may be.
	MaxClockSkew daemon.Duration `toml:"max_clock_skew"`
	// WatchHistory is how many changes are kept for watchers to resume.
	WatchHistory uint64 `toml:"watch_history"`
	// MSTCacheNodes bounds the index nodes cached in memory.
	MSTCacheNodes int `toml:"mst_cache_nodes"`

	// NodeName is the name shown for this node (default: the hostname).
	NodeName string `toml:"node_name"`
	// BindAddr is the IP the peer port listens on (default: all).
	BindAddr string `toml:"bind_addr"`
	// PeerPort is the TCP port of the mutual-TLS peer API.
	PeerPort uint32 `toml:"peer_port"`

	// Gossip.
	PushFanout          int             `toml:"push_fanout"`
	PushRounds          int             `toml:"push_rounds"`
	PushInterval        daemon.Duration `toml:"push_interval"`
	AntiEntropyInterval daemon.Duration `toml:"anti_entropy_interval"`

	// Failure detection.
	ProbeInterval    daemon.Duration `toml:"probe_interval"`
	ProbeTimeout     daemon.Duration `toml:"probe_timeout"`
	SuspicionTimeout daemon.Duration `toml:"suspicion_timeout"`

	// TombstoneRetention is how long deleted documents are remembered; it
	// must exceed the longest partition the cluster should heal from.
	TombstoneRetention daemon.Duration `toml:"tombstone_retention"`
	// CertValidity is the lifetime of node certificates; they are renewed
	// when a third of it remains.
	CertValidity daemon.Duration `toml:"cert_validity"`
}

// DefaultPeerPort is the peer API's default TCP port.
const DefaultPeerPort = 7470

func (c *Config) gossipConfig() gossip.Config {
	g := gossip.DefaultConfig()
	g.Fanout = c.PushFanout
	g.PushRounds = c.PushRounds
	g.PushInterval = time.Duration(c.PushInterval)
	g.AntiEntropyInterval = time.Duration(c.AntiEntropyInterval)
	return g
}

func (c *Config) memberConfig() member.Config {
	m := member.DefaultConfig()
	m.ProbeInterval = time.Duration(c.ProbeInterval)
	m.ProbeTimeout = time.Duration(c.ProbeTimeout)
	m.SuspicionTimeout = time.Duration(c.SuspicionTimeout)
	return m
}

// Spec describes shoal-statd to the daemon runtime.
func Spec() daemon.Spec {
	return daemon.Spec{
		Name:  "statd",
		Short: "Shoal state daemon: replicated cluster state as CRDT documents",
		Long: `shoal-statd keeps this node's copy of the cluster state: CRDT documents on
Pebble indexed by a Merkle Search Tree, served on <run-dir>/statd.sock
(shoal.state.v1). Writes are durable when acknowledged; watchers resume
from a revision across reconnects and restarts.`,
		MetricsPort: 9461,
		Config: func(c daemon.Common) daemon.Configurable {
			g, m := gossip.DefaultConfig(), member.DefaultConfig()
			return &Config{
				Common:              c,
				MaxClockSkew:        daemon.Duration(hlc.DefaultMaxSkew),
				WatchHistory:        100_000,
				MSTCacheNodes:       16_384,
				PeerPort:            DefaultPeerPort,
				PushFanout:          g.Fanout,
				PushRounds:          g.PushRounds,
				PushInterval:        daemon.Duration(g.PushInterval),
				AntiEntropyInterval: daemon.Duration(g.AntiEntropyInterval),
				ProbeInterval:       daemon.Duration(m.ProbeInterval),
				ProbeTimeout:        daemon.Duration(m.ProbeTimeout),
				SuspicionTimeout:    daemon.Duration(m.SuspicionTimeout),
				TombstoneRetention:  daemon.Duration(72 * time.Hour),
				CertValidity:        daemon.Duration(30 * 24 * time.Hour),
			}
		},
		Flags: func(fs *pflag.FlagSet, cfg any) {
			c := cfg.(*Config)
			fs.StringVar(&c.NodeID, "node-id", c.NodeID, "node ID to use on first start (default: random)")
			fs.Var(&c.MaxClockSkew, "max-clock-skew", "reject peer timestamps further ahead than this")
			fs.Uint64Var(&c.WatchHistory, "watch-history", c.WatchHistory, "changes kept for watchers to resume from")
			fs.IntVar(&c.MSTCacheNodes, "mst-cache-nodes", c.MSTCacheNodes, "index nodes cached in memory")
			fs.StringVar(&c.NodeName, "node-name", c.NodeName, "name shown for this node (default: hostname)")
			fs.StringVar(&c.BindAddr, "bind-addr", c.BindAddr, "IP the peer port listens on (default: all)")
			fs.Uint32Var(&c.PeerPort, "peer-port", c.PeerPort, "TCP port of the mutual-TLS peer API")
			fs.IntVar(&c.PushFanout, "push-fanout", c.PushFanout, "peers each gossip push round reaches")
			fs.IntVar(&c.PushRounds, "push-rounds", c.PushRounds, "rounds a change is pushed for")
			fs.Var(&c.PushInterval, "push-interval", "interval between gossip push rounds")
			fs.Var(&c.AntiEntropyInterval, "anti-entropy-interval", "interval between anti-entropy rounds")
			fs.Var(&c.ProbeInterval, "probe-interval", "failure detection probe interval")
			fs.Var(&c.ProbeTimeout, "probe-timeout", "failure detection probe timeout")
			fs.Var(&c.SuspicionTimeout, "suspicion-timeout", "time a suspect member has to refute before it is declared dead")
			fs.Var(&c.TombstoneRetention, "tombstone-retention", "how long deleted documents are remembered")
			fs.Var(&c.CertValidity, "cert-validity", "lifetime of node certificates")
		},
		Start: start,
	}
}

// Main runs shoal-statd.
func Main(args []string) int { return daemon.Main(Spec(), args) }

func start(ctx context.Context, rt *daemon.Runtime) (func(context.Context) error, error) {
	cfg := rt.Config.(*Config)
	if cfg.WatchHistory == 0 {
		return nil, fmt.Errorf("watch_history must be positive")
	}
	clock := hlc.NewClock(nil, time.Duration(cfg.MaxClockSkew))
	st, err := store.Open(store.Options{
		Dir:           filepath.Join(cfg.StateDir, "db"),
		NodeID:        cfg.NodeID,
		Clock:         clock,
		Logger:        rt.Log.With("component", "store"),
		WatchHistory:  cfg.WatchHistory,
		MSTCacheNodes: cfg.MSTCacheNodes,
	})
	if err != nil {
		return nil, err
	}
	if cfg.NodeID != "" {
		if err := pki.ValidateNodeID(cfg.NodeID); err != nil {
			st.Close()
			return nil, err
		}
	}
	statev1.RegisterStateServer(rt.GRPC, &stateServer{st: st})
	cl := newCluster(cfg, st, rt.Log)
	clusterv1.RegisterClusterServer(rt.GRPC, &clusterServer{c: cl})
	clusterv1.RegisterSecretsServer(rt.GRPC, &secretsServer{c: cl})
	rt.Metrics.MustRegister(newSyncCollector(cl))
	if err := cl.resume(ctx); err != nil {
		st.Close()
		return nil, err
	}
	rt.Metrics.MustRegister(newCollector(st))
	// statd is alive while its store answers a read: a wedged Pebble makes
	// systemd restart it.
	rt.Liveness = func(context.Context) error {
		_, err := st.GetRaw(keyClusterConfig)
		return err
	}
	rt.Details = func() map[string]string {
		s := st.Status()
		return map[string]string{
			"node_id":  s.NodeID,
			"keys":     strconv.FormatUint(s.Live, 10),
			"revision": strconv.FormatUint(s.Revision, 10),
			"root":     fmt.Sprintf("%x", s.Root[:8]),
		}
	}
	go func() {
		n, err := st.Scrub(ctx)
		if err != nil {
			rt.Log.Error("index scrub", "entries", n, "err", err)
			return
		}
		rt.Log.Info("index scrub clean", "entries", n)
	}()
	return func(context.Context) error {
		cl.close()
		return st.Close()
	}, nil
}

// collector exports the store's status as Prometheus metrics at scrape
// time, so there is one source of truth for the numbers.
type collector struct {
	st    *store.Store
	descs map[string]*prometheus.Desc
	keys  *prometheus.Desc
	tombs *prometheus.Desc
	rev   *prometheus.Desc
}

func newCollector(st *store.Store) *collector {
	c := &collector{
		st:    st,
		descs: map[string]*prometheus.Desc{},
		keys:  prometheus.NewDesc("shoal_statd_documents", "Live documents.", nil, nil),
		tombs: prometheus.NewDesc("shoal_statd_tombstones", "Deleted documents still remembered.", nil, nil),
		rev:   prometheus.NewDesc("shoal_statd_revision", "Latest local revision.", nil, nil),
	}
	for name := range st.Status().Counters {
		c.descs[name] = prometheus.NewDesc("shoal_statd_"+name+"_total", "Store counter "+name+".", nil, nil)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.tombs
	ch <- c.rev
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.st.Status()
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(s.Live))
	ch <- prometheus.MustNewConstMetric(c.tombs, prometheus.GaugeValue, float64(s.Tombstones))
	ch <- prometheus.MustNewConstMetric(c.rev, prometheus.CounterValue, float64(s.Revision))
	for name, v := range s.Counters {
		if d, ok := c.descs[name]; ok {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
		}
	}
}

func numCPU() int { return runtime.NumCPU() }

// syncCollector exports the per-peer sync counters of the gossip layer.
type syncCollector struct {
	c     *cluster
	descs map[string]*prometheus.Desc
}

func newSyncCollector(c *cluster) *syncCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("shoal_statd_sync_"+name, help, []string{"peer"}, nil)
	}
	return &syncCollector{c: c, descs: map[string]*prometheus.Desc{
		"bytes_sent":       d("bytes_sent_total", "Bytes sent to a peer by gossip and anti-entropy."),
		"bytes_received":   d("bytes_received_total", "Bytes received from a peer."),
		"entries_sent":     d("entries_sent_total", "Documents sent to a peer."),
		"entries_received": d("entries_received_total", "Documents received from a peer."),
		"rounds":           d("rounds_total", "Completed anti-entropy rounds with a peer."),
		"rejected":         d("rejected_total", "Documents from a peer refused (clock skew, malformed)."),
		"failures":         d("failures_total", "Failed calls to a peer."),
		"last_sync":        d("last_sync_timestamp_seconds", "When the last anti-entropy round with a peer completed."),
	}}
}

func (s *syncCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range s.descs {
		ch <- d
	}
}

func (s *syncCollector) Collect(ch chan<- prometheus.Metric) {
	for peer, p := range s.c.counters.Snapshot() {
		for name, v := range map[string]uint64{
			"bytes_sent": p.BytesSent, "bytes_received": p.BytesReceived,
			"entries_sent": p.EntriesSent, "entries_received": p.EntriesReceived,
			"rounds": p.Rounds, "rejected": p.Rejected, "failures": p.Failures,
		} {
			ch <- prometheus.MustNewConstMetric(s.descs[name], prometheus.CounterValue, float64(v), peer)
		}
		if !p.LastSync.IsZero() {
			ch <- prometheus.MustNewConstMetric(s.descs["last_sync"], prometheus.GaugeValue, float64(p.LastSync.UnixNano())/1e9, peer)
		}
	}
}
