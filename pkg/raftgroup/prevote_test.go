package raftgroup_test

import (
	"fmt"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// TestPreVoteRejoinDoesNotDisrupt cuts a follower off from its group for
// many election timeouts while the leader keeps committing, then lets it
// back. With PreVote the cut-off follower only ever pre-campaigns, which
// it cannot win, so its term does not grow; once back, the leader keeps
// its leadership and its term. Without PreVote the follower would bump
// its term at every election timeout, and its first answer after the
// heal (a response at that higher term) would depose the leader.
func TestPreVoteRejoinDoesNotDisrupt(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 12})
	c.CreateGroup(1, 1, 2, 3)
	leader := c.WaitLeader(1, 100)
	write(t, c, leader, 1, "before", "x")
	converge(t, c, 1, 1, 2, 3)
	lst, err := c.Host(leader).Status(1)
	if err != nil {
		t.Fatal(err)
	}
	follower := raftgroup.NodeID(1)
	if follower == leader {
		follower = 2
	}
	fst, err := c.Host(follower).Status(1)
	if err != nil {
		t.Fatal(err)
	}
	if fst.Term != lst.Term {
		t.Fatalf("follower at term %d, leader at %d before the partition\n%s", fst.Term, lst.Term, c.String(1))
	}

	c.Net.Isolate(follower, c.NodeIDs())
	// The follower notices the silence and campaigns (a quiesced group
	// wakes when its peers go silent).
	campaigned := c.RunUntil(100, func() bool {
		st, err := c.Host(follower).Status(1)
		return err == nil && (st.Role == "pre-candidate" || st.Role == "candidate")
	})
	c.Require(campaigned, "the cut-off follower never campaigned\n%s", c.String(1))
	// Many election timeouts pass (ElectionTicks is 10) while the
	// majority commits more, so the follower also falls behind.
	for i := range 5 {
		write(t, c, leader, 1, fmt.Sprint("during", i), "y")
		c.RunTicks(20)
	}
	st, err := c.Host(follower).Status(1)
	if err != nil {
		t.Fatal(err)
	}
	if st.Term != fst.Term {
		t.Fatalf("the cut-off follower's term went from %d to %d: it campaigned without PreVote\n%s", fst.Term, st.Term, c.String(1))
	}

	c.Net.Heal()
	converge(t, c, 1, 1, 2, 3)
	write(t, c, leader, 1, "after", "z")
	converge(t, c, 1, 1, 2, 3)
	for _, n := range c.NodeIDs() {
		st, err := c.Host(n).Status(1)
		if err != nil {
			t.Fatal(err)
		}
		if st.Term != lst.Term || st.LeaderNode != leader {
			t.Fatalf("node %d: term %d leader node %d after the rejoin, want term %d leader node %d\n%s",
				n, st.Term, st.LeaderNode, lst.Term, leader, c.String(1))
		}
	}
	if st, _ := c.Host(leader).Status(1); st.Role != "leader" {
		t.Fatalf("node %d lost its leadership to a rejoining follower\n%s", leader, c.String(1))
	}
}
