package vold

import (
	"errors"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// A removal's fence holds back mounts of the incarnation it names until
// it is lifted or lapses; another incarnation of the name mounts.
func TestRemovalFenceHoldsItsIncarnation(t *testing.T) {
	n := &node{fences: map[string]fenceHold{}}
	n.fences["v"] = fenceHold{group: 7, until: time.Now().Add(time.Minute)}
	if err := n.fencedLocked("v", 7); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fenced incarnation: %v, want failed precondition", err)
	}
	if err := n.fencedLocked("v", 8); err != nil {
		t.Fatalf("a new volume of the same name: %v", err)
	}
	if err := n.fencedLocked("w", 7); err != nil {
		t.Fatalf("another volume: %v", err)
	}
	n.liftOwn(removalFence{Name: "v", Group: 8})
	if err := n.fencedLocked("v", 7); err == nil {
		t.Fatal("lifting another incarnation's fence lifted this one")
	}
	n.liftOwn(removalFence{Name: "v", Group: 7})
	if err := n.fencedLocked("v", 7); err != nil {
		t.Fatalf("after the lift: %v", err)
	}
	n.fences["v"] = fenceHold{group: 7, until: time.Now().Add(-time.Second)}
	if err := n.fencedLocked("v", 7); err != nil {
		t.Fatalf("lapsed fence: %v", err)
	}
	if _, ok := n.fences["v"]; ok {
		t.Fatal("a lapsed fence is kept")
	}
}
