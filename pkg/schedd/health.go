package schedd

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/shoal-dev/shoal/pkg/sched"
)

// checkHealth runs one health check of task id: its command in the
// container, or an HTTP GET or TCP connection from this node to the task.
// overlay says the task has an overlay address of its own (netd's);
// otherwise it shares its node's network namespace, and is reached on
// 127.0.0.1.
func (n *node) checkHealth(ctx context.Context, id string, h sched.HealthCheck, overlay bool) bool {
	if h.HTTP == "" && h.TCP == 0 {
		code, err := n.rt.Exec(ctx, id, h.Cmd, nil, io.Discard, io.Discard, nil)
		return err == nil && code == 0
	}
	addr := "127.0.0.1"
	if overlay {
		// Not known yet (the task's document not in the mirror): not
		// healthy yet, rather than a check of whatever listens on the
		// node itself.
		if addr = n.taskIP(id); addr == "" {
			return false
		}
	}
	if h.TCP != 0 {
		return probeTCP(ctx, addr, h.TCP)
	}
	port, path, err := h.HTTPTarget()
	return err == nil && probeHTTP(ctx, addr, port, path)
}

// taskIP is the overlay address netd gave task id ("" if unknown).
func (n *node) taskIP(id string) string {
	d := n.mirror.Get(sched.TaskKey(id))
	if d == nil {
		return ""
	}
	ip, err := netip.ParseAddr(d.GetFields()["ip"].GetStringValue())
	if err != nil {
		return ""
	}
	return ip.String()
}

func probeTCP(ctx context.Context, addr string, port int) bool {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// healthClient makes health checks' GETs: no proxy from the environment
// (the task is on this node), no connection kept between checks, and no
// redirect followed (a 3xx answer is healthy, as a kubelet's probe has
// it, and a redirect could lead off the node).
var healthClient = &http.Client{
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

func probeHTTP(ctx context.Context, addr string, port int, path string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(addr, strconv.Itoa(port))+path, nil)
	if err != nil {
		return false
	}
	req.Header.Set("User-Agent", "shoal-health-check")
	resp, err := healthClient.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}
