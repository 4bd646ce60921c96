package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
)

// TestScheddSpecFieldsOnOlderNode runs node 3 on a real schedd from before
// spec fields were published (SHOAL_OLD_SCHEDD, which `make upgrade-check`
// builds from commit OLD_SCHEDD, the last before --limit-pids; the test is
// skipped without it). A service that sets --limit-pids, a field that
// schedd would drop, is placed on nodes 1 and 2 only, node 3 reported as
// too old; a service without new fields runs on all three. Upgraded,
// node 3 takes the pids-limited task; downgraded again, its node document
// still lists the fields the newer schedd published, and is not believed.
func TestScheddSpecFieldsOnOlderNode(t *testing.T) {
	old := os.Getenv("SHOAL_OLD_SCHEDD")
	if old == "" {
		t.Skip("SHOAL_OLD_SCHEDD is not set (make upgrade-check sets it)")
	}
	flag := oldOnNode3(t, "shoal-schedd", old)
	c := newSchedCluster(t)

	// A name that node 1 or 2 owns: an older owner places anywhere.
	name := func(prefix string) string {
		for i := 0; ; i++ {
			if n := fmt.Sprintf("%s%d", prefix, i); sched.Owner(n, c.ids) != c.ids[2] {
				return n
			}
		}
	}
	create := func(svc string, extra ...string) {
		t.Helper()
		args := append([]string{"service", "create", svc, "--image", "local/busybox:latest", "--replicas", "3",
			"--replicas-max-per-node", "1", "--stop-grace", "1s", "--detach"}, extra...)
		c.mustCtl(1, append(args, "--", "sleep", "1000000")...)
		removeIfFailed(t, c.Cluster, 1, svc)
	}
	unschedulable := func(svc string) string {
		out, _, code := c.ctl(2, "service", "inspect", svc, "-o", "json")
		var v struct {
			Unschedulable []string `json:"unschedulable"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
			return ""
		}
		return strings.Join(v.Unschedulable, "; ")
	}
	const tooOld = "1 runs a schedd that does not know spec field pids_limit (upgrade it)"

	plain, limited := name("plain"), name("pids")
	create(plain)
	create(limited, "--limit-pids", "64")
	if got := c.perNode(plain, 3); got != [3]int{1, 1, 1} {
		t.Errorf("%s without new fields runs %v per node, want one on each (node 3's old schedd too)", plain, got)
	}
	waitFor(t, 20*time.Second, "node 3 reported too old for "+limited, func() bool { return strings.Contains(unschedulable(limited), tooOld) })
	if got := c.perNode(limited, 2); got != [3]int{1, 1, 0} {
		t.Errorf("%s with --limit-pids runs %v per node, want none on node 3", limited, got)
	}

	// Upgraded: node 3 publishes pids_limit and takes the third task.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	restart := func() {
		t.Helper()
		if err := c.Stop(ctx, 3, "schedd", 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, 3, "schedd"); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	restart()
	waitFor(t, 30*time.Second, "the third task of "+limited+" on node 3", func() bool { return c.perNode(limited, 3) == [3]int{1, 1, 1} })
	if out := c.mustCtl(1, "node", "inspect", "n3"); !strings.Contains(out, "pids_limit") {
		t.Errorf("node inspect of the upgraded node 3:\n%s", out)
	}

	// Downgraded: the list the newer schedd wrote is older than the old
	// schedd's start, and no longer counts.
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	restart()
	// Until its write reaches an owner, the owner believes the list
	// still: a task placed in that moment would run without the field
	// (the old schedd accepts whatever it is asked).
	waitFor(t, 20*time.Second, "nodes 1 and 2 see node 3's schedd as old", func() bool {
		for i := 1; i <= 2; i++ {
			var v struct {
				SpecFields []string `json:"spec_fields"`
			}
			out, _, code := c.ctl(i, "node", "inspect", "n3", "-o", "json")
			if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.SpecFields == nil || len(v.SpecFields) > 0 {
				return false
			}
		}
		return true
	})
	again := name("again")
	create(again, "--limit-pids", "64")
	waitFor(t, 20*time.Second, "node 3 reported too old again for "+again, func() bool { return strings.Contains(unschedulable(again), tooOld) })
	if got := c.perNode(again, 2); got != [3]int{1, 1, 0} {
		t.Errorf("%s after the downgrade runs %v per node, want none on node 3", again, got)
	}
	for _, svc := range []string{plain, limited, again} {
		c.mustCtl(1, "service", "rm", svc)
	}
}
