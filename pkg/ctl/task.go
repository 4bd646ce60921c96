package ctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/shoal-dev/shoal/pkg/client"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

func (a *app) taskCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Inspect tasks: logs, exec, stats"}
	cmd.AddCommand(a.taskLs(), a.taskInspect(), a.taskLogs(), a.taskExec(), a.taskStats(), a.taskCopy())
	return cmd
}

func (a *app) taskLs() *cobra.Command {
	var format, node, service string
	var filters []string
	var all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List tasks (of every service, or one node or service)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.ListTasks(ctx, &schedv1.ListTasksRequest{Node: node, Service: service, All: all})
			if err != nil {
				return err
			}
			tasks, err := applyFilter(filters, taskFilters, resp.GetTasks())
			if err != nil {
				return err
			}
			return renderTasks(a, format, tasks)
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "ID")
	cmd.Flags().StringVar(&node, "node", "", "only tasks of this node (ID or name)")
	cmd.Flags().StringVar(&service, "service", "", "only tasks of this service")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include finished tasks")
	filterFlag(cmd, &filters, taskFilters)
	return cmd
}

func (a *app) taskInspect() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "inspect ID",
		Short: "Show a task",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format == "table" {
				format = "yaml"
			}
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			t, err := c.GetTask(ctx, &schedv1.GetTaskRequest{Id: args[0]})
			if err != nil {
				return err
			}
			return render(a.out, format, taskViewOf(t), func(*tabwriter.Writer) {})
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "yaml", "output format: yaml or json")
	return cmd
}

func (a *app) taskLogs() *cobra.Command {
	var opts logOptions
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a task's log (from any node): its output on stdout, its errors on stderr",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := opts.request(args[0], time.Now())
			if err != nil {
				return usageError{err}
			}
			c, err := a.schedd()
			if err != nil {
				return err
			}
			defer c.Close()
			return streamLogs(cmd.Context(), c, req, a.out, a.errOut)
		},
	}
	opts.register(cmd.Flags(), "keep printing new output", "only the last N lines (0: all)")
	return cmd
}

func (a *app) serviceLogs() *cobra.Command {
	var opts logOptions
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print the logs of a service's tasks, each line prefixed with its task",
		Long: `Print the logs of a service's current tasks, each line prefixed with
service.slot@node: their output on stdout, their errors on stderr. With -f,
keep printing, including the output of tasks that replace them (restarts
elsewhere, updates, scaling), until interrupted.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := opts.request("", time.Now())
			if err != nil {
				return usageError{err}
			}
			c, err := a.schedd()
			if err != nil {
				return err
			}
			defer c.Close()
			return a.followService(cmd.Context(), c, args[0], req)
		},
	}
	opts.register(cmd.Flags(), "keep printing new output, of new tasks too", "only the last N lines of each task (0: all)")
	return cmd
}

// serviceLogsPoll is how often `service logs -f` looks for new tasks.
const serviceLogsPoll = time.Second

// serviceArrival bounds how long `service logs` waits for a service this
// node does not know yet: one created on another node a moment ago
// reaches this node's statd by gossip.
const serviceArrival = 3 * time.Second

// awaitService returns nil once this node knows service, or its last
// error: NotFound for a service no node has told it of within
// serviceArrival.
func awaitService(ctx context.Context, c *client.Schedd, service string) error {
	deadline := time.Now().Add(serviceArrival)
	for {
		_, err := c.GetService(ctx, &schedv1.GetServiceRequest{Name: service})
		if err == nil || status.Code(err) != codes.NotFound || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// followService streams the logs of a service's current tasks to a.out
// and a.errOut, asking each as req does. With req.Follow it keeps looking
// for tasks that start later and streams theirs as well, until ctx ends;
// each task's stream ends by itself once the task has finished.
func (a *app) followService(ctx context.Context, c *client.Schedd, service string, req *schedv1.TaskLogsRequest) error {
	follow := req.GetFollow()
	// An empty listing would not tell a typo from a service without
	// tasks.
	if err := awaitService(ctx, c, service); err != nil {
		return err
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	streaming := map[string]bool{}
	for {
		resp, err := c.ListTasks(ctx, &schedv1.ListTasksRequest{Service: service})
		switch {
		case err != nil && !follow:
			return err
		case err != nil && ctx.Err() == nil:
			// A schedd restarting: try again at the next poll.
			fmt.Fprintf(a.errOut, "list tasks of %s: %s\n", service, describe(err))
		case err == nil:
			for _, t := range resp.GetTasks() {
				if !t.GetCurrent() || streaming[t.GetId()] {
					continue
				}
				streaming[t.GetId()] = true
				wg.Add(1)
				go func() {
					defer wg.Done()
					prefix := fmt.Sprintf("%s.%s@%s | ", t.GetService(), t.GetSlot(), t.GetNode())
					stdout := &prefixWriter{mu: &mu, w: a.out, prefix: prefix, bol: true}
					stderr := &prefixWriter{mu: &mu, w: a.errOut, prefix: prefix, bol: true}
					treq := proto.Clone(req).(*schedv1.TaskLogsRequest)
					treq.Task = t.GetId()
					if err := streamLogs(ctx, c, treq, stdout, stderr); err != nil && ctx.Err() == nil {
						err = fmt.Errorf("task %s: %w", t.GetId(), err)
						mu.Lock()
						if follow {
							fmt.Fprintf(a.errOut, "%s\n", describe(err))
						}
						errs = append(errs, err)
						mu.Unlock()
					}
				}()
			}
		}
		if !follow {
			break
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil // interrupted: what failed was shown as it happened
		case <-time.After(serviceLogsPoll):
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (a *app) taskExec() *cobra.Command {
	var interactive, tty bool
	cmd := &cobra.Command{
		Use:   "exec ID -- CMD [ARGS...]",
		Short: "Run a command in a task (from any node); exits with its status",
		Long: `Runs a command in a running task, on whichever node runs it, and exits
with its status. -i forwards stdin; -t gives the command a terminal (its
output then comes as one stream), sized as this one and resized with it;
-it runs an interactive shell: shoalctl task exec -it ID -- sh.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.schedd()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			stream, err := c.TaskExec(ctx)
			if err != nil {
				return err
			}
			var sendMu sync.Mutex // a gRPC stream takes one sender at a time
			send := func(in *schedv1.ExecInput) error {
				sendMu.Lock()
				defer sendMu.Unlock()
				return stream.Send(in)
			}
			first := &schedv1.ExecInput{Task: args[0], Args: args[1:], StdinClosed: !interactive, Tty: tty}
			if tty {
				restore, err := localTerminal(ctx, first, send, interactive)
				if err != nil {
					return err
				}
				defer restore()
			}
			if err := send(first); err != nil {
				return err
			}
			if interactive {
				go func() {
					buf := make([]byte, 32<<10)
					for {
						n, err := os.Stdin.Read(buf)
						if n > 0 {
							if send(&schedv1.ExecInput{Stdin: append([]byte(nil), buf[:n]...)}) != nil {
								return
							}
						}
						if err != nil {
							send(&schedv1.ExecInput{StdinClosed: true})
							return
						}
					}
				}()
			}
			for {
				out, err := stream.Recv()
				if err != nil {
					return err
				}
				a.out.Write(out.GetStdout())
				a.errOut.Write(out.GetStderr())
				if out.GetExited() {
					if code := out.GetExitCode(); code != 0 {
						return exitError{code: int(code)}
					}
					return nil
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "forward stdin to the command")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "give the command a terminal")
	return cmd
}

// localTerminal prepares a -t exec when shoalctl's own stdin is a
// terminal: it gives first its size and sends a resize whenever the
// window changes (SIGWINCH) until ctx ends; with raw (-i too) it puts the
// terminal in raw mode, so that keys reach the command as typed, Ctrl-C
// included (as docker exec -it does). restore puts the terminal back.
// Without a terminal on stdin (a pipe, a script) the command still gets
// one, of the runtime's default size.
func localTerminal(ctx context.Context, first *schedv1.ExecInput, send func(*schedv1.ExecInput) error, raw bool) (restore func(), err error) {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return func() {}, nil
	}
	if w, h, err := term.GetSize(fd); err == nil {
		first.Width, first.Height = uint32(w), uint32(h)
	}
	var state *term.State
	if raw {
		if state, err = term.MakeRaw(fd); err != nil {
			return nil, fmt.Errorf("terminal: %w", err)
		}
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
				if w, h, err := term.GetSize(fd); err == nil && send(&schedv1.ExecInput{Width: uint32(w), Height: uint32(h)}) != nil {
					return
				}
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		if state != nil {
			term.Restore(fd, state)
		}
	}, nil
}

// exitError makes shoalctl exit with a command's own status.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }
