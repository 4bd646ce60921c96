package devcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// partitionTable names the nftables tables (families inet and arp) that
// Partition puts in the nodes' namespaces. The namespaces are the
// cluster's own, so nothing else can own a table there.
const partitionTable = "shoal_dev_partition"

// Partition cuts the cluster into groups of nodes: nodes in different
// groups exchange no packets at all (IPv4 and ARP are dropped on input and
// output inside each namespace; the package leaves IPv6 off). Nodes in no
// group keep talking to everyone, as do the host and each node's own
// loopback. A new Partition replaces the previous one; Heal undoes it.
func (c *Cluster) Partition(ctx context.Context, groups [][]int) error {
	if len(groups) < 2 {
		return invalidf("a partition needs at least two groups of nodes, e.g. 1,2 3")
	}
	groupOf := map[int]int{}
	for g, nodes := range groups {
		if len(nodes) == 0 {
			return invalidf("group %d of the partition is empty", g+1)
		}
		for _, i := range nodes {
			if err := c.CheckNode(i); err != nil {
				return err
			}
			if _, dup := groupOf[i]; dup {
				return invalidf("node %d is in two groups", i)
			}
			groupOf[i] = g
		}
	}
	var errs []error
	for i := 1; i <= c.spec.Nodes; i++ {
		g, grouped := groupOf[i]
		var blocked []string
		for j := 1; j <= c.spec.Nodes; j++ {
			if h, ok := groupOf[j]; grouped && ok && h != g {
				blocked = append(blocked, c.Addr(j))
			}
		}
		if err := c.applyBlock(ctx, i, blocked); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.logf("partitioned: %s", formatGroups(groups))
	return c.setPartition(groups)
}

// Heal removes any partition.
func (c *Cluster) Heal(ctx context.Context) error {
	var errs []error
	for i := 1; i <= c.spec.Nodes; i++ {
		if err := c.applyBlock(ctx, i, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.logf("healed")
	return c.setPartition(nil)
}

// applyBlock replaces node i's partition tables with ones that drop all
// traffic to and from blocked (none: no tables), in one nft transaction.
func (c *Cluster) applyBlock(ctx context.Context, i int, blocked []string) error {
	var b strings.Builder
	// Declaring then deleting makes the delete succeed whether or not the
	// table exists.
	for _, fam := range []string{"inet", "arp"} {
		fmt.Fprintf(&b, "table %s %s\ndelete table %s %s\n", fam, partitionTable, fam, partitionTable)
	}
	if len(blocked) > 0 {
		set := "{ " + strings.Join(blocked, ", ") + " }"
		fmt.Fprintf(&b, `table inet %[1]s {
	set blocked { type ipv4_addr; elements = %[2]s; }
	chain input { type filter hook input priority -300; policy accept; ip saddr @blocked drop; }
	chain output { type filter hook output priority -300; policy accept; ip daddr @blocked drop; }
}
table arp %[1]s {
	chain input { type filter hook input priority -300; policy accept; arp saddr ip %[2]s drop; }
	chain output { type filter hook output priority -300; policy accept; arp daddr ip %[2]s drop; }
}
`, partitionTable, set)
	}
	if !netnsExists(c.Netns(i)) {
		return fmt.Errorf("node %d: network namespace %s does not exist", i, c.Netns(i))
	}
	path, err := exec.LookPath("nft")
	if err != nil {
		return fmt.Errorf("nft not found: install nftables")
	}
	cmd := exec.CommandContext(ctx, path, "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := inNetns(c.NetnsPath(i), cmd.Start); err != nil {
		return fmt.Errorf("node %d: nft: %w", i, err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("node %d: nft: %v: %s", i, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (c *Cluster) setPartition(groups [][]int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec.Partition = slices.Clone(groups)
	return c.save(false)
}

func formatGroups(groups [][]int) string {
	parts := make([]string, len(groups))
	for g, nodes := range groups {
		s := make([]string, len(nodes))
		for k, n := range nodes {
			s[k] = fmt.Sprint(n)
		}
		parts[g] = strings.Join(s, ",")
	}
	return strings.Join(parts, " | ")
}
