package schedd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

func TestProbes(t *testing.T) {
	// A port nothing listens on: take one and free it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := int(netip.MustParseAddrPort(l.Addr().String()).Port())
	l.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
		case "/moved":
			// Followed, it would fail: a 3xx is healthy as it is.
			http.Redirect(w, r, fmt.Sprintf("http://127.0.0.1:%d/", closed), http.StatusFound)
		default:
			http.Error(w, "no", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	port := int(netip.MustParseAddrPort(srv.Listener.Addr().String()).Port())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for path, want := range map[string]bool{"/ok": true, "/moved": true, "/sick": false} {
		if got := probeHTTP(ctx, "127.0.0.1", port, path); got != want {
			t.Errorf("GET %s: healthy %v, want %v", path, got, want)
		}
	}
	if !probeTCP(ctx, "127.0.0.1", port) {
		t.Error("TCP to a listening port: unhealthy")
	}
	if probeTCP(ctx, "127.0.0.1", closed) || probeHTTP(ctx, "127.0.0.1", closed, "/") {
		t.Error("a closed port: healthy")
	}
}
