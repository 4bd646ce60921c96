package daemon

import (
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricsHandlerServesPprofOnlyOnLoopback(t *testing.T) {
	reg := prometheus.NewRegistry()
	loop := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9464}

	// Without the flag: metrics only.
	h, err := metricsHandler(reg, loop, false)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
	if body, _ := io.ReadAll(rec.Body); strings.Contains(string(body), "goroutine") {
		t.Fatalf("pprof served without --debug-pprof: %q", body)
	}

	// With it, on loopback: the profiler's index, and metrics still.
	h, err = metricsHandler(reg, loop, true)
	if err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
	if body, _ := io.ReadAll(rec.Body); rec.Code != 200 || !strings.Contains(string(body), "goroutine") {
		t.Fatalf("pprof index: %d %q", rec.Code, body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("metrics with pprof on: %d", rec.Code)
	}

	// Anywhere else: refused.
	for _, a := range []net.Addr{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 9464}, &net.TCPAddr{IP: net.IPv4zero, Port: 9464}} {
		if _, err := metricsHandler(reg, a, true); err == nil {
			t.Fatalf("pprof allowed on %s", a)
		}
	}
}
