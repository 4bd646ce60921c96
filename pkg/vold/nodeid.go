package vold

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// Shoal names nodes with hex strings (statd draws 12 random hex digits,
// "c905aab72d29"); the Raft host names them with a non-zero uint64. The
// mapping is the hex value itself, so every vold computes the same number
// for a node without asking anyone, and a certificate's node ID maps to
// the same number the sender uses for itself. Node IDs that are not 1 to
// 16 hex digits, or are all zeros, cannot host replicas: vold refuses to
// start on such a node and ignores such peers.
//
// The way back (number to string) is not a formatting rule, since "0a1b"
// and "a1b" parse alike: nodeNames remembers every ID it has parsed.

// raftNodeID maps a Shoal node ID to the Raft host's node ID.
func raftNodeID(id string) (raftgroup.NodeID, error) {
	if id == "" || len(id) > 16 {
		return 0, fmt.Errorf("node ID %q is not 1 to 16 hex digits: %w", id, errdefs.ErrInvalidArgument)
	}
	v, err := strconv.ParseUint(id, 16, 64)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("node ID %q is not a non-zero hex number: %w", id, errdefs.ErrInvalidArgument)
	}
	return raftgroup.NodeID(v), nil
}

// nodeNames maps Raft node IDs back to the Shoal node IDs they came from.
type nodeNames struct {
	mu    sync.RWMutex
	names map[raftgroup.NodeID]string
}

func newNodeNames() *nodeNames { return &nodeNames{names: map[raftgroup.NodeID]string{}} }

// add parses id and remembers it; it returns the Raft node ID.
func (n *nodeNames) add(id string) (raftgroup.NodeID, error) {
	r, err := raftNodeID(id)
	if err != nil {
		return 0, err
	}
	n.mu.Lock()
	n.names[r] = id
	n.mu.Unlock()
	return r, nil
}

// name returns the Shoal node ID of r; for a node never seen, the plain
// hex form (right for every ID statd generates without a leading zero).
func (n *nodeNames) name(r raftgroup.NodeID) string {
	n.mu.RLock()
	s, ok := n.names[r]
	n.mu.RUnlock()
	if ok {
		return s
	}
	return strconv.FormatUint(uint64(r), 16)
}
