package wg

import (
	"os"
	"testing"
)

func TestNetns(t *testing.T) {
	requireRoot(t)
	own, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	name := netnsName()
	path, err := CreateNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	defer DeleteNetns(name)
	if path != NetnsPath(name) {
		t.Fatalf("path %s", path)
	}
	if _, err := CreateNetns(name); err == nil {
		t.Fatal("created twice")
	}
	var inside string
	if err := InNetns(path, func() (err error) {
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == own {
		t.Fatalf("InNetns ran in our own namespace %s", own)
	}
	// A second entry sees the same namespace; ours is untouched.
	var again string
	InNetns(path, func() (err error) { again, err = os.Readlink("/proc/thread-self/ns/net"); return })
	if again != inside {
		t.Fatalf("namespace changed: %s then %s", inside, again)
	}
	if now, _ := os.Readlink("/proc/thread-self/ns/net"); now != own {
		t.Fatalf("caller moved to %s", now)
	}
	// A new namespace has only lo, down.
	n := openNetlink(t, path)
	if ok, err := n.LinkExists("lo"); !ok || err != nil {
		t.Fatalf("lo: %v %v", ok, err)
	}
	if err := InNetns("/nonexistent/ns", func() error { return nil }); err == nil {
		t.Fatal("InNetns into a missing namespace")
	}
	if err := DeleteNetns(name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", path, err)
	}
	if err := DeleteNetns(name); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := CreateNetns(bad); err == nil {
			t.Errorf("CreateNetns(%q) accepted", bad)
		}
		if err := DeleteNetns(bad); err == nil {
			t.Errorf("DeleteNetns(%q) accepted", bad)
		}
	}
}
