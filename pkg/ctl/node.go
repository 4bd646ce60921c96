package ctl

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

func (a *app) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "List, inspect, label, pause, drain and remove cluster nodes"}
	cmd.AddCommand(a.nodeLs(), a.nodeInspect(), a.nodeLabel(), a.nodeAvailability("drain"), a.nodeAvailability("pause"),
		a.nodeAvailability("activate"), a.nodeRm(), a.nodePs(), a.nodeUpdate())
	return cmd
}

// nodePs is Docker's node ps: task ls --node.
func (a *app) nodePs() *cobra.Command {
	var format string
	var all bool
	cmd := &cobra.Command{
		Use:   "ps [NODE]",
		Short: "List the tasks of a node (default: this one); task ls --node",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			node := ""
			if len(args) == 1 {
				node = args[0]
			} else {
				st, ctx, done, err := a.statdCall(cmd)
				if err != nil {
					return err
				}
				resp, err := st.Cluster.Status(ctx, &clusterv1.StatusRequest{})
				done()
				if err != nil {
					return err
				}
				if node = resp.GetNodeId(); node == "" {
					return fmt.Errorf("this node is in no cluster: name a node")
				}
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.ListTasks(ctx, &schedv1.ListTasksRequest{Node: node, All: all})
			if err != nil {
				return err
			}
			return renderTasks(a, format, resp.GetTasks())
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "ID")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include finished tasks")
	return cmd
}

// nodeView is a node as shoalctl shows it: its document plus this node's
// view of its liveness.
type nodeView struct {
	ID      string            `json:"id"`
	Name    string            `json:"name"`
	Addr    string            `json:"addr"`
	State   string            `json:"state"`
	CPUs    int64             `json:"cpus"`
	Memory  int64             `json:"memory"`
	Version string            `json:"version"`
	Labels  map[string]string `json:"labels"`
	Left    bool              `json:"left,omitempty"`
	// ShutDown: its scheduler said its machine shut down and handed its
	// tasks over, and has not started since.
	ShutDown bool   `json:"shutdown,omitempty"`
	Revision uint64 `json:"revision"`
	// Availability is active, pause or drain (node update).
	Availability string `json:"availability"`
	// Tasks counts the tasks on the node that have not finished, and
	// ReservedCPUMillis and ReservedMemory what they reserve of its
	// capacity, as the task documents say.
	Tasks             int   `json:"tasks"`
	ReservedCPUMillis int64 `json:"reserved_cpu_millis"`
	ReservedMemory    int64 `json:"reserved_memory"`
	// SpecFields are the spec fields beyond the baseline its schedd
	// knows (docs/SCHEDULING.md, Mixed versions): none from a schedd
	// from before the list, which places no task that sets one there.
	SpecFields []string `json:"spec_fields"`
}

// stateText is the STATE column: membership's word, and a shutdown's.
func (v nodeView) stateText() string {
	if v.ShutDown && !v.Left {
		return v.State + " (shut down)"
	}
	return v.State
}

// statdNodes connects to statd and loads the nodes; the caller closes the
// client.
func (a *app) statdNodes(cmd *cobra.Command) (*client.Statd, []nodeView, error) {
	c, err := a.statd()
	if err != nil {
		return nil, nil, err
	}
	nodes, err := a.loadNodes(cmd, c)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, nodes, nil
}

func (a *app) loadNodes(cmd *cobra.Command, c *client.Statd) ([]nodeView, error) {
	ctx, cancel := a.ctx(cmd)
	defer cancel()
	states := map[string]string{}
	if st, err := c.Cluster.Status(ctx, &clusterv1.StatusRequest{}); err == nil {
		for _, m := range st.GetMembers() {
			states[m.GetId()] = m.GetState()
		}
	}
	var out []nodeView
	// With the fields' stamps, which say whether its schedd's list of
	// spec fields is current (sched.NodeFromDoc).
	if err := listAll(ctx, c, sched.NodesPrefix, true, func(d *statev1.Document) bool {
		out = append(out, nodeOf(d, states))
		return true
	}); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name+out[i].ID < out[j].Name+out[j].ID })
	return out, nil
}

// countTasks fills in the nodes' unfinished tasks and what they reserve,
// from the task documents: for node ls and inspect only, not for the
// commands that load the nodes to find one by name.
func (a *app) countTasks(cmd *cobra.Command, c *client.Statd, nodes []nodeView) error {
	ctx, cancel := a.ctx(cmd)
	defer cancel()
	byID := map[string]*nodeView{}
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	return listAll(ctx, c, sched.TasksPrefix, false, func(d *statev1.Document) bool {
		t, ok := sched.TaskFromDoc(strings.TrimPrefix(d.GetKey(), sched.TasksPrefix), statepb.FromDocument(d))
		if n := byID[t.Node]; ok && n != nil && !t.State.Terminal() {
			n.Tasks++
			n.ReservedCPUMillis += t.Resources.CPUMillis
			n.ReservedMemory += t.Resources.MemoryBytes
		}
		return true
	})
}

func nodeOf(d *statev1.Document, states map[string]string) nodeView {
	f := d.GetFields()
	v := nodeView{
		ID:       strings.TrimPrefix(d.GetKey(), "/nodes/"),
		Name:     f["name"].GetStringValue(),
		Addr:     f["addr"].GetStringValue(),
		CPUs:     f["cpus"].GetIntValue(),
		Memory:   f["memory"].GetIntValue(),
		Version:  f["version"].GetStringValue(),
		Left:     f["left"].GetBoolValue(),
		ShutDown: f["shutdown"].GetBoolValue(),
		Labels:   map[string]string{},
		Revision: d.GetRevision(),
		// The document's word, sched.NodeFromDoc's default.
		Availability: cmp.Or(f["availability"].GetStringValue(), string(sched.Active)),
	}
	for k, val := range f {
		if l, ok := strings.CutPrefix(k, "label."); ok {
			v.Labels[l] = val.GetStringValue()
		}
	}
	v.SpecFields = slices.Sorted(maps.Keys(sched.NodeFromDoc(v.ID, statepb.FromDocument(d), false).SpecFields))
	if v.SpecFields == nil {
		v.SpecFields = []string{}
	}
	v.State = states[v.ID]
	if v.State == "" {
		v.State = "unknown"
	}
	if v.Left {
		v.State = "left"
	}
	return v
}

// findNode resolves NODE given as an ID, an ID prefix or a name.
func findNode(nodes []nodeView, ref string) (nodeView, error) {
	var hits []nodeView
	for _, n := range nodes {
		if n.ID == ref {
			return n, nil
		}
		if n.Name == ref || strings.HasPrefix(n.ID, ref) {
			hits = append(hits, n)
		}
	}
	switch len(hits) {
	case 1:
		return hits[0], nil
	case 0:
		return nodeView{}, notFoundError{fmt.Errorf("no node %q (see `shoalctl node ls`)", ref)}
	}
	var ids []string
	for _, h := range hits {
		ids = append(ids, h.ID)
	}
	return nodeView{}, usageError{fmt.Errorf("%q matches several nodes: %s; use the ID", ref, strings.Join(ids, ", "))}
}

func (a *app) nodeLs() *cobra.Command {
	var format string
	var filters []string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the cluster's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, nodes, err := a.statdNodes(cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := a.countTasks(cmd, c, nodes); err != nil {
				return err
			}
			if nodes, err = applyFilter(filters, nodeFilters, nodes); err != nil {
				return err
			}
			if nodes == nil {
				nodes = []nodeView{}
			}
			return render(a.out, format, nodes, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "ID\tNAME\tADDRESS\tSTATE\tAVAILABILITY\tTASKS\tCPUS\tMEMORY\tLABELS")
				for _, n := range nodes {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", n.ID, n.Name, n.Addr, n.stateText(), n.Availability, n.Tasks, n.CPUs,
						bytesText(uint64(n.Memory)), labelsText(n.Labels))
				}
			})
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "ID")
	filterFlag(cmd, &filters, nodeFilters)
	return cmd
}

func labelsText(l map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}

func (a *app) nodeInspect() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "inspect NODE",
		Short: "Show one node (by ID, ID prefix or name)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, nodes, err := a.statdNodes(cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			n, err := findNode(nodes, args[0])
			if err != nil {
				return err
			}
			one := []nodeView{n}
			if err := a.countTasks(cmd, c, one); err != nil {
				return err
			}
			n = one[0]
			return render(a.out, format, n, func(tw *tabwriter.Writer) {
				fields := strings.Join(n.SpecFields, ", ")
				if fields == "" {
					fields = "the baseline only (a schedd from before spec fields were published: tasks that set newer fields go elsewhere)"
				}
				fmt.Fprintf(tw, "ID\t%s\nNAME\t%s\nADDRESS\t%s\nSTATE\t%s\nAVAILABILITY\t%s\nCPUS\t%d\nMEMORY\t%s\nTASKS\t%d\nRESERVED\t%s CPU, %s memory\nVERSION\t%s\nSPEC FIELDS\t%s\nLABELS\t%s\n",
					n.ID, n.Name, n.Addr, n.stateText(), n.Availability, n.CPUs, bytesText(uint64(n.Memory)), n.Tasks,
					strconv.FormatFloat(float64(n.ReservedCPUMillis)/1000, 'f', -1, 64), bytesText(uint64(n.ReservedMemory)), n.Version, fields, labelsText(n.Labels))
			})
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func (a *app) nodeLabel() *cobra.Command {
	var rm []string
	cmd := &cobra.Command{
		Use:     "label NODE [KEY=VALUE...] [--rm KEY...]",
		Short:   "Set or remove labels of a node",
		Example: "  shoalctl node label n2 zone=eu disk=ssd\n  shoalctl node label n2 --rm disk",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && len(rm) == 0 {
				return usageError{fmt.Errorf("nothing to do: give KEY=VALUE labels or --rm KEY")}
			}
			id, err := a.setNodeLabels(cmd, args[0], args[1:], rm)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "node %s labels updated\n", id)
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&rm, "rm", nil, "label keys to remove")
	return cmd
}

// setNodeLabels sets labels (KEY=VALUE) of the node ref names and removes
// the keys rm; it returns the node's ID.
func (a *app) setNodeLabels(cmd *cobra.Command, ref string, labels, rm []string) (string, error) {
	set := map[string]*statev1.Value{}
	for _, kv := range labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", usageError{fmt.Errorf("label %q: want KEY=VALUE", kv)}
		}
		set["label."+k] = &statev1.Value{Kind: &statev1.Value_StringValue{StringValue: v}}
	}
	c, nodes, err := a.statdNodes(cmd)
	if err != nil {
		return "", err
	}
	defer c.Close()
	n, err := findNode(nodes, ref)
	if err != nil {
		return "", err
	}
	ctx, cancel := a.ctx(cmd)
	defer cancel()
	if len(set) > 0 {
		if _, err := c.Put(ctx, &statev1.PutRequest{Key: "/nodes/" + n.ID, Fields: set}); err != nil {
			return "", err
		}
	}
	if len(rm) > 0 {
		var fields []string
		for _, k := range rm {
			fields = append(fields, "label."+k)
		}
		if _, err := c.Delete(ctx, &statev1.DeleteRequest{Key: "/nodes/" + n.ID, Fields: fields}); err != nil {
			return "", err
		}
	}
	return n.ID, nil
}

func (a *app) nodeAvailability(verb string) *cobra.Command {
	short := "Move a node's tasks elsewhere and take no new ones"
	availability := "drain"
	switch verb {
	case "activate":
		short, availability = "Let a drained or paused node take tasks again", "active"
	case "pause":
		short, availability = "Take no new tasks on a node, keeping those it runs", "pause"
	}
	var noWait bool
	cmd := &cobra.Command{
		Use:   verb + " NODE",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.setAvailability(cmd, args[0], availability, !noWait)
		},
	}
	if verb == "drain" {
		cmd.Flags().BoolVar(&noWait, "detach", false, "return without waiting for the tasks to move")
	}
	return cmd
}

// setAvailability sets the availability of the node ref names (a drain
// waits for its tasks to move if wait is set) and says what it did.
func (a *app) setAvailability(cmd *cobra.Command, ref, availability string, wait bool) error {
	st, nodes, err := a.statdNodes(cmd)
	if err != nil {
		return err
	}
	defer st.Close()
	n, err := findNode(nodes, ref)
	if err != nil {
		return err
	}
	c, err := a.schedd()
	if err != nil {
		return err
	}
	defer c.Close()
	resp, err := c.SetNodeAvailability(cmd.Context(), &schedv1.SetNodeAvailabilityRequest{Node: n.ID, Availability: availability, Wait: wait && availability == "drain"})
	if err != nil {
		return err
	}
	switch availability {
	case "drain":
		fmt.Fprintf(a.out, "node %s drained (%d tasks moved)\n", n.ID, resp.GetMoved())
	case "pause":
		fmt.Fprintf(a.out, "node %s paused: no new tasks; its tasks keep running\n", n.ID)
	default:
		fmt.Fprintf(a.out, "node %s active\n", n.ID)
	}
	return nil
}

// nodeUpdate is Docker's node update: labels and availability at once.
func (a *app) nodeUpdate() *cobra.Command {
	var add, rm []string
	var availability string
	cmd := &cobra.Command{
		Use:     "update NODE [--label-add KEY=VALUE]... [--label-rm KEY]... [--availability active|pause|drain]",
		Short:   "Change a node's labels and availability (docker node update's flags)",
		Example: "  shoalctl node update n2 --label-add zone=eu --availability drain",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch availability {
			case "", "active", "pause", "drain":
			default:
				return usageError{fmt.Errorf("--availability %q: want active, pause or drain", availability)}
			}
			if len(add) == 0 && len(rm) == 0 && availability == "" {
				return usageError{fmt.Errorf("nothing to do: give --label-add, --label-rm or --availability")}
			}
			if len(add) > 0 || len(rm) > 0 {
				id, err := a.setNodeLabels(cmd, args[0], add, rm)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.out, "node %s labels updated\n", id)
			}
			if availability != "" {
				return a.setAvailability(cmd, args[0], availability, true)
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&add, "label-add", nil, "add or change a label KEY=VALUE (repeatable)")
	cmd.Flags().StringArrayVar(&rm, "label-rm", nil, "remove a label KEY (repeatable)")
	cmd.Flags().StringVar(&availability, "availability", "", "active, pause or drain (a drain waits for the tasks to move)")
	return cmd
}

func (a *app) nodeRm() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm NODE...",
		Short: "Remove nodes that are gone for good (dead or left)",
		Long: `Removes nodes that are dead or have left: their document goes (labels,
capacity, overlay address) and no member probes them any more. Refused
for a live node (stop it, or run 'shoalctl cluster leave' on it, first)
and while a volume still has a replica on the node: vold moves a dead
node's replicas to other nodes --replace-after its death (30 s by
default). --force skips the volume check when vold cannot be asked.

A removed node that comes back is no member: leave and join again.`,
		Example: "  shoalctl node rm n4",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, nodes, err := a.statdNodes(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, ref := range args {
				n, err := findNode(nodes, ref)
				if err != nil {
					return err
				}
				if n.State == "alive" || n.State == "suspect" {
					return fmt.Errorf("node %s (%s) is %s: stop it, or run `shoalctl cluster leave` on it, first", n.Name, n.ID, n.State)
				}
				if err := a.checkNoReplicas(cmd, n, force); err != nil {
					return err
				}
				ctx, cancel := a.ctx(cmd)
				_, err = st.Cluster.RemoveNode(ctx, &clusterv1.RemoveNodeRequest{NodeId: n.ID})
				cancel()
				if err != nil {
					return err
				}
				fmt.Fprintf(a.out, "node %s (%s) removed\n", n.Name, n.ID)
				a.forgetNodeTasks(cmd, n)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove even if vold cannot say whether the node holds volume replicas")
	return cmd
}

// forgetNodeTasks has schedd delete the removed node's task records,
// which its own agent would have deleted; the node is removed either way.
func (a *app) forgetNodeTasks(cmd *cobra.Command, n nodeView) {
	c, ctx, done, err := a.scheddCall(cmd)
	if err == nil {
		defer done()
		var resp *schedv1.ForgetNodeTasksResponse
		if resp, err = c.ForgetNodeTasks(ctx, &schedv1.ForgetNodeTasksRequest{NodeId: n.ID}); err == nil {
			if resp.GetForgotten() > 0 {
				fmt.Fprintf(a.out, "  %d task records of it dropped\n", resp.GetForgotten())
			}
			return
		}
	}
	fmt.Fprintf(a.errOut, "warning: the task records of node %s stay, shown as on a down node (schedd: %s)\n", n.ID, describe(err))
}

// checkNoReplicas refuses to remove a node that still holds volume
// replicas: vold replaces those of a dead node, and the group needs the
// member's record until then.
func (a *app) checkNoReplicas(cmd *cobra.Command, n nodeView, force bool) error {
	c, ctx, done, err := a.voldCall(cmd)
	if err == nil {
		defer done()
		var resp *volv1.ListVolumesResponse
		if resp, err = c.Volumes.ListVolumes(ctx, &volv1.ListVolumesRequest{}); err == nil {
			var held []string
			for _, v := range resp.GetVolumes() {
				if slices.ContainsFunc(v.GetMembers(), func(m *volv1.Member) bool { return m.GetNode() == n.ID }) {
					held = append(held, v.GetName())
				}
			}
			if len(held) > 0 {
				return fmt.Errorf("node %s (%s) still holds a replica of volume %s: vold moves them --replace-after the node's death; try again then",
					n.Name, n.ID, strings.Join(held, ", "))
			}
			return nil
		}
	}
	if force {
		fmt.Fprintf(a.errOut, "warning: volumes not checked (vold: %s)\n", describe(err))
		return nil
	}
	return fmt.Errorf("cannot check the volumes of node %s (vold: %s): --force removes it anyway", n.ID, describe(err))
}
