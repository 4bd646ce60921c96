package daemon

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsHandler serves the registry's metrics and, with withPprof, Go's
// profiler under /debug/pprof/. The profiler is refused unless the
// listener is on loopback: it is a debugging aid for someone on the node
// (bench/vold uses it), never something to expose to the network.
func metricsHandler(reg *prometheus.Registry, addr net.Addr, withPprof bool) (http.Handler, error) {
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	if !withPprof {
		return metrics, nil
	}
	if ta, ok := addr.(*net.TCPAddr); !ok || !ta.IP.IsLoopback() {
		return nil, fmt.Errorf("--debug-pprof: the metrics address %s is not a loopback address", addr)
	}
	mux := http.NewServeMux()
	mux.Handle("/", metrics)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux, nil
}
