package vold

import "testing"

// A member holding the leader's last committed entry in its log, not yet
// applied, is caught up; one whose log reaches that far only with another
// term's entries is not.
func TestHoldsCommitted(t *testing.T) {
	for _, c := range []struct {
		name string
		st   replicaStatus
		want bool
	}{
		{"applied", replicaStatus{Term: 3, Applied: 10, LastIndex: 10}, true},
		{"in its log", replicaStatus{Term: 3, Applied: 9, LastIndex: 10}, true},
		{"behind", replicaStatus{Term: 3, Applied: 8, LastIndex: 9}, false},
		{"an older term's log", replicaStatus{Term: 2, Applied: 8, LastIndex: 12}, false},
	} {
		if got := holdsCommitted(c.st, 10, 3); got != c.want {
			t.Errorf("%s: holdsCommitted = %v, want %v", c.name, got, c.want)
		}
	}
}
