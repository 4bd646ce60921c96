package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/wg"
)

// netdLeftovers removes what a node's netd made outside the cluster's
// dirs: the network namespaces of its tasks (/var/run/netns/shoal-<task>,
// named in netd's address allocations) and its WireGuard holder's socket.
func (c *Cluster) netdLeftovers(ctx context.Context, i int) error {
	dir := c.StateDir(i, "netd")
	var errs []error
	if b, err := os.ReadFile(filepath.Join(dir, "ipam.json")); err == nil {
		var ipam overlay.IPAM
		if err := json.Unmarshal(b, &ipam); err == nil {
			for _, a := range ipam.Allocations() {
				name := "shoal-" + a.Owner
				path := wg.NetnsPath(name)
				if _, err := os.Stat(path); err != nil {
					continue
				}
				if err := killNetns(ctx, path); err != nil {
					errs = append(errs, fmt.Errorf("node %d: %s: %w", i, name, err))
				}
				if err := wg.DeleteNetns(name); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("node %d: %s: %w", i, name, err))
				}
			}
		}
	}
	c.removeDeadHolderSocket(i)
	return errors.Join(errs...)
}

// removeDeadHolderSocket removes the UAPI socket of node i's WireGuard
// holder once the holder is dead. The socket is in the machine-wide
// /var/run/wireguard, and a SIGKILLed holder leaves it; killNode calls
// this too, because the node's state dir that names the interface may be
// gone (wiped, or the node re-made under a new ID) before Down runs.
func (c *Cluster) removeDeadHolderSocket(i int) {
	b, err := os.ReadFile(filepath.Join(c.StateDir(i, "netd"), "iface"))
	if err != nil {
		return
	}
	if iface := strings.TrimSpace(string(b)); iface != "" && !wg.HolderAlive(iface) {
		os.Remove(wg.SocketPath(iface))
	}
}
