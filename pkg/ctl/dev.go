package ctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/devcluster"
)

func (a *app) devCommand() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local multi-node cluster, one network namespace per node (needs root)",
		Long: `shoalctl dev runs a whole Shoal cluster on this machine: every node is a
network namespace (shoal-NAME-<i>) with its own address on a bridge
(shbr-NAME), running the real daemons from the directory of this shoalctl.
State and logs are under /var/lib/shoal-dev/NAME, sockets under
/run/shoal-dev/NAME. Nothing is forwarded off the machine.`,
		Example: `  sudo bin/shoalctl dev up --nodes 3
  sudo bin/shoalctl dev exec 1 -- shoalctl state put /demo/hello msg=hi
  sudo bin/shoalctl dev status
  sudo bin/shoalctl dev down`,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if os.Geteuid() != 0 {
				return errors.New("shoalctl dev needs root: it creates network namespaces, a bridge and veth pairs (try sudo)")
			}
			return nil
		},
	}
	cmd.PersistentFlags().StringVar(&name, "name", devcluster.DefaultName, "name of the dev cluster")
	cmd.AddCommand(a.devUp(&name), a.devDown(&name), a.devStatus(&name), a.devExec(&name),
		a.devKill(&name), a.devStart(&name), a.devPartition(&name), a.devHeal(&name))
	return cmd
}

// usageArgs makes a wrong number of arguments a usage error (exit 2).
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// loadDev finds the dev cluster called name, with a hint when there is none.
func loadDev(name string) (*devcluster.Cluster, error) {
	c, err := devcluster.Load(name)
	if err != nil {
		if devNotFound(err) {
			return nil, fmt.Errorf("%w: start one with `shoalctl dev up%s`", err, nameFlag(name))
		}
		return nil, err
	}
	return c, nil
}

func devNotFound(err error) bool { return err != nil && errdefs.IsNotFound(err) }

// nameFlag returns " --name NAME" unless name is the default.
func nameFlag(name string) string {
	if name == devcluster.DefaultName {
		return ""
	}
	return " --name " + name
}

// progName is how the user invoked shoalctl: its bare name when that is
// what $PATH finds, else the path they typed.
func progName() string {
	prog := os.Args[0]
	base := filepath.Base(prog)
	if found, err := exec.LookPath(base); err == nil {
		if a, err1 := filepath.EvalSymlinks(found); err1 == nil {
			if b, err2 := filepath.EvalSymlinks(prog); err2 == nil && a == b {
				return base
			}
		}
	}
	return prog
}

func (a *app) devUp(name *string) *cobra.Command {
	var (
		nodes       int
		subnet      string
		binDir      string
		daemons     []string
		noBootstrap bool
		keep        bool
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the namespaces, start every node's daemons and join them into a cluster",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if existing, err := devcluster.Load(*name); err == nil {
				return fmt.Errorf("dev cluster %q already exists (%d nodes on %s): run `shoalctl dev down%s` first, or choose another --name",
					*name, existing.Nodes(), existing.Subnet(), nameFlag(*name))
			}
			if binDir == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the bin dir: %w (give --bin-dir)", err)
				}
				if exe, err = filepath.EvalSymlinks(exe); err != nil {
					return fmt.Errorf("find the bin dir: %w (give --bin-dir)", err)
				}
				binDir = filepath.Dir(exe)
			}
			spec := devcluster.Spec{
				Name:      *name,
				Nodes:     nodes,
				Subnet:    subnet,
				BinDir:    binDir,
				Bootstrap: !noBootstrap,
				// Up keeps a failed cluster; we tear it down here, to say how
				// to keep it.
				KeepOnFailure: true,
				Logf:          func(format string, args ...any) { fmt.Fprintf(a.out, format+"\n", args...) },
			}
			running := devcluster.DefaultDaemons
			if cmd.Flags().Changed("daemons") {
				spec.Daemons = daemons
				running = daemons
			}
			spec.Args = map[string][]string{}
			if slices.Contains(running, "statd") {
				// Nodes share the host's hostname; name them after their number.
				spec.Args["statd"] = []string{"--node-name", "n{node}"}
			}
			if slices.Contains(running, "schedd") {
				// Every node gets its own containerd, as a real machine would.
				spec.Extra = append(spec.Extra, devcluster.ContainerdProcess(""))
				spec.Args["schedd"] = devcluster.ScheddArgs()
			}
			if nodes < 1 {
				return usageError{fmt.Errorf("--nodes must be at least 1")}
			}
			c, err := devcluster.Up(cmd.Context(), spec)
			if err != nil {
				switch {
				case c == nil:
					return err
				case keep:
					return fmt.Errorf("%w\nthe half-made cluster is kept: see `shoalctl dev status%s` and the logs, then `shoalctl dev down%s`", err, nameFlag(*name), nameFlag(*name))
				}
				fmt.Fprintln(a.out, "start-up failed: tearing down")
				dctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), time.Minute)
				defer cancel()
				if derr := c.Down(dctx); derr != nil {
					return fmt.Errorf("%w\nand tearing down failed too: %v\n(run `shoalctl dev down%s`)", err, derr, nameFlag(*name))
				}
				return fmt.Errorf("%w\n(the half-made cluster was torn down with its logs; --keep-on-error keeps it)", err)
			}
			prog, nf := progName(), nameFlag(*name)
			addrs := c.Addr(1)
			if c.Nodes() > 1 {
				addrs = fmt.Sprintf("%s to %s", c.Addr(1), c.Addr(c.Nodes()))
			}
			fmt.Fprintf(a.out, "\ndev cluster %q is up: %d nodes, %s.\n", c.Name(), c.Nodes(), addrs)
			if noBootstrap {
				fmt.Fprintf(a.out, "The nodes were not joined (--no-bootstrap): each is a cluster of its own.\n")
			}
			fmt.Fprintf(a.out, "\nTry:\n")
			last := c.Nodes()
			if c.Nodes() < 2 || noBootstrap {
				last = 1
			}
			for _, line := range []string{
				fmt.Sprintf("%s dev exec%s 1 -- shoalctl state put /demo/hello msg=hi", prog, nf),
				fmt.Sprintf("%s dev exec%s %d -- shoalctl state get /demo/hello", prog, nf, last),
				fmt.Sprintf("%s dev status%s", prog, nf),
				fmt.Sprintf("%s dev kill%s 1 statd; %s dev start%s 1 statd", prog, nf, prog, nf),
				fmt.Sprintf("%s dev down%s", prog, nf),
			} {
				fmt.Fprintf(a.out, "  %s\n", line)
			}
			if c.Nodes() >= 2 {
				fmt.Fprintf(a.out, "  (%s dev partition%s 1 2-%d cuts node 1 off; %s dev heal%s mends it)\n", prog, nf, c.Nodes(), prog, nf)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&nodes, "nodes", devcluster.DefaultNodes, "number of nodes")
	f.StringVar(&subnet, "subnet", devcluster.DefaultSubnet, "IPv4 subnet of the bridge, or \"auto\" for a free /24 of 10.99.0.0/16")
	f.StringVar(&binDir, "bin-dir", "", "directory of shoal-<daemon> and shoalctl (default: the directory of this shoalctl)")
	f.StringSliceVar(&daemons, "daemons", devcluster.DefaultDaemons, "daemons to run on every node")
	f.BoolVar(&noBootstrap, "no-bootstrap", false, "start the daemons but do not run cluster init/join")
	f.BoolVar(&keep, "keep-on-error", false, "if start-up fails, keep the half-made cluster for inspection")
	return cmd
}

func (a *app) devDown(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Kill every node's processes and remove the namespaces, links and directories",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := devcluster.Load(*name)
			if devNotFound(err) {
				// No record: clean up whatever a crash left under that name.
				found, err := devcluster.Purge(cmd.Context(), *name)
				if err != nil {
					return err
				}
				if found {
					fmt.Fprintf(a.out, "removed the leftovers of dev cluster %q\n", *name)
				} else {
					fmt.Fprintf(a.out, "no dev cluster named %q: nothing to do\n", *name)
				}
				return nil
			}
			if err != nil {
				return err
			}
			if err := c.Down(cmd.Context()); err != nil {
				return fmt.Errorf("%w\n(run `shoalctl dev down%s` again once the cause is fixed)", err, nameFlag(*name))
			}
			fmt.Fprintf(a.out, "dev cluster %q is down\n", *name)
			return nil
		},
	}
}

func (a *app) devStatus(name *string) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the nodes, their addresses and whether each process runs",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, err := loadDev(*name)
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			return render(a.out, format, st, func(tw *tabwriter.Writer) {
				bridge := st.Bridge
				if !st.BridgeUp {
					bridge += " (missing)"
				}
				fmt.Fprintf(tw, "CLUSTER\t%s\nSUBNET\t%s (bridge %s, %s)\nBINARIES\t%s\n", st.Name, st.Subnet, bridge, st.BridgeAddr, st.BinDir)
				if len(st.Partition) > 0 {
					fmt.Fprintf(tw, "PARTITION\t%s\n", formatPartition(st.Partition))
				}
				fmt.Fprintln(tw, "\nNODE\tADDRESS\tNETNS\tPROCESS\tSTATE\tPID")
				for _, n := range st.Nodes {
					netns := n.Netns
					if !n.NetnsUp {
						netns += " (missing)"
					}
					if len(n.Processes) == 0 {
						fmt.Fprintf(tw, "%d\t%s\t%s\t-\t-\t-\n", n.Node, n.Addr, netns)
					}
					for _, p := range n.Processes {
						state, pid := "stopped", "-"
						if p.Running {
							state, pid = "starting", strconv.Itoa(p.PID)
							if p.Ready {
								state = "ready"
							}
						}
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.Addr, netns, p.Name, state, pid)
					}
				}
			})
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func formatPartition(groups [][]int) string {
	parts := make([]string, len(groups))
	for g, nodes := range groups {
		s := make([]string, len(nodes))
		for k, n := range nodes {
			s[k] = strconv.Itoa(n)
		}
		parts[g] = strings.Join(s, ",")
	}
	return strings.Join(parts, " | ")
}

// parseNode parses a node number argument.
func parseNode(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, usageError{fmt.Errorf("node %q: want a node number, 1 or more", s)}
	}
	return n, nil
}

func (a *app) devExec(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "exec NODE -- CMD [ARG...]",
		Short: "Run a command inside a node's network namespace, with SHOAL_RUN_DIR set to its sockets",
		Long: `Runs CMD in node NODE's network namespace with SHOAL_RUN_DIR pointing at the
node's sockets and the cluster's bin dir first in PATH, so plain shoalctl
talks to that node. Standard input and output are passed through; the
exit code is CMD's.`,
		Example: `  shoalctl dev exec 1 -- shoalctl state put /demo/hello msg=hi
  shoalctl dev exec 2 -- shoalctl daemon status
  shoalctl dev exec 3 -- sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usageError{fmt.Errorf("want a node and a command: shoalctl dev exec NODE -- CMD [ARG...]")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			i, err := parseNode(args[0])
			if err != nil {
				return err
			}
			c, err := loadDev(*name)
			if err != nil {
				return err
			}
			// Never cancelled: the command lives as long as it wants;
			// Ctrl-C reaches it from the terminal directly.
			ec, err := c.Command(context.Background(), i, args[1:]...)
			if err != nil {
				return err
			}
			ec.Stdin, ec.Stdout, ec.Stderr = os.Stdin, a.out, a.errOut
			if err := c.StartIn(i, ec); err != nil {
				return err
			}
			code, err := devcluster.ExitCode(ec.Wait())
			if err != nil {
				return err
			}
			if code != 0 {
				// NB: the command's own exit code, passed through untouched;
				// it has already said what went wrong.
				os.Exit(code)
			}
			return nil
		},
	}
}

func (a *app) devKill(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "kill NODE [DAEMON]",
		Short: "SIGKILL a daemon of a node, or every process of the node",
		Args:  usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			i, err := parseNode(args[0])
			if err != nil {
				return err
			}
			c, err := loadDev(*name)
			if err != nil {
				return err
			}
			what := ""
			if len(args) == 2 {
				what = args[1]
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			if err := c.Kill(ctx, i, what); err != nil {
				return err
			}
			if what == "" {
				what = "every process"
			}
			fmt.Fprintf(a.out, "node %d: killed %s\n", i, what)
			return nil
		},
	}
}

func (a *app) devStart(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "start NODE [DAEMON]",
		Short: "Start a daemon of a node (or all its stopped processes) and wait until it serves",
		Args:  usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			i, err := parseNode(args[0])
			if err != nil {
				return err
			}
			c, err := loadDev(*name)
			if err != nil {
				return err
			}
			c.SetLogf(func(format string, args ...any) { fmt.Fprintf(a.out, format+"\n", args...) })
			what := ""
			if len(args) == 2 {
				what = args[1]
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			return c.Start(ctx, i, what)
		},
	}
}

func (a *app) devPartition(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "partition GROUP GROUP...",
		Short: "Cut the network between groups of nodes (e.g. 1,2 3,4,5); nodes in no group are unaffected",
		Example: `  shoalctl dev partition 1 2,3     # node 1 alone; 2 and 3 together
  shoalctl dev partition 1,2 3-5   # ranges work too
  shoalctl dev heal`,
		Args: usageArgs(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			groups := make([][]int, len(args))
			for g, arg := range args {
				nodes, err := parseGroup(arg)
				if err != nil {
					return err
				}
				groups[g] = nodes
			}
			c, err := loadDev(*name)
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			if err := c.Partition(ctx, groups); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "partitioned: %s\n", formatPartition(groups))
			return nil
		},
	}
}

// parseGroup parses a group of nodes: 1,2,5 or 3-5 or 1,3-4.
func parseGroup(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := parseNode(lo)
		if err != nil {
			return nil, usageError{fmt.Errorf("group %q: want node numbers like 1,2 or 3-5", s)}
		}
		last := first
		if isRange {
			if last, err = parseNode(hi); err != nil || last < first {
				return nil, usageError{fmt.Errorf("group %q: want node numbers like 1,2 or 3-5", s)}
			}
		}
		for n := first; n <= last; n++ {
			out = append(out, n)
		}
	}
	return out, nil
}

func (a *app) devHeal(name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "heal",
		Short: "Remove any partition",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := loadDev(*name)
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			if err := c.Heal(ctx); err != nil {
				return err
			}
			fmt.Fprintln(a.out, "healed: every node reaches every other")
			return nil
		},
	}
}
