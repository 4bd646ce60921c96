// Package ctl implements shoalctl, the command-line interface. Commands
// are grouped by noun (daemon, state, ...) and talk only to the local
// daemons' sockets, found in --run-dir or $SHOAL_RUN_DIR.
//
// Exit codes: 0 success, 1 failure, 2 bad usage or input, 3 not found,
// 4 a daemon is unreachable.
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/buildinfo"
	"github.com/shoal-dev/shoal/pkg/client"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitUnavailable = 4
)

// app holds what every command shares.
type app struct {
	runDir  string
	timeout time.Duration
	out     io.Writer
	errOut  io.Writer
}

// usageError marks errors in how shoalctl was called.
type usageError struct{ error }

// notFoundError marks a named thing that does not exist.
type notFoundError struct{ error }

// Main runs shoalctl with args and returns the exit code.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

// run is Main with its context and output given (tests call it).
func run(ctx context.Context, args []string, out, errOut io.Writer) int {
	a := &app{out: out, errOut: errOut}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code // the command's own status; it printed its own errors
	}
	fmt.Fprintf(a.errOut, "error: %s\n", describe(err))
	return exitCode(err)
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "shoalctl",
		Short: "Control a Shoal node and cluster",
		Long: `shoalctl talks to the Shoal daemons of this node over their local sockets
(--run-dir, or $SHOAL_RUN_DIR, default /run/shoal), or to another node's
through ssh (--host ssh://[user@]host[:port], or $SHOAL_HOST), which runs
shoalctl there.

Exit codes: 0 success, 1 failure, 2 bad usage or input, 3 not found,
4 a daemon is unreachable.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&a.runDir, "run-dir", client.RunDirFromEnv(), "directory of the daemons' sockets ($SHOAL_RUN_DIR)")
	root.PersistentFlags().DurationVar(&a.timeout, "timeout", 30*time.Second, "give up on a call after this long")
	var host string
	root.PersistentFlags().StringVarP(&host, "host", "H", os.Getenv(hostEnv),
		"another node's daemons, through ssh: ssh://[user@]host[:port] ($"+hostEnv+"; files named stay on this machine)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return a.useHost(cmd, host) }
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(a.daemonCommand(), a.stateCommand(), a.clusterCommand(), a.nodeCommand(), a.serviceCommand(), a.stackCommand(), a.taskCommand(), a.imageCommand(), a.secretCommand(), a.configCommand(), a.registryCommand(), a.networkCommand(), a.volumeCommand(), a.lockCommand(), a.kvCommand(), a.devCommand(), a.eventsCommand(),
		a.taskStats(), // `shoalctl stats`, as `docker stats`
		a.taskCopy(),  // `shoalctl cp`, as `docker cp`
		a.dialStdio())
	usageErrors(root)
	return root
}

// usageErrors makes cobra's own checks of c and its subcommands exit with
// the usage status (2), as flag errors do: a wrong number of arguments, a
// missing required flag, an unknown subcommand. Cobra returns them as
// plain errors (status 1), and prints a group command's help with status
// 0 whatever words follow it, so a typo in a script passed unnoticed.
func usageErrors(c *cobra.Command) {
	for _, sub := range c.Commands() {
		usageErrors(sub)
	}
	if !c.Runnable() {
		c.Args = cobra.NoArgs
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	// PreRunE runs just before cobra's own flag checks: the same checks,
	// made first, return the usage error.
	pre := c.PreRunE
	c.PreRunE = func(cmd *cobra.Command, a []string) error {
		if err := cmd.ValidateRequiredFlags(); err != nil {
			return usageError{err}
		}
		if err := cmd.ValidateFlagGroups(); err != nil {
			return usageError{err}
		}
		if pre != nil {
			return pre(cmd, a)
		}
		return nil
	}
}

// ctx returns a context bounded by --timeout.
func (a *app) ctx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), a.timeout)
}

func (a *app) statd() (*client.Statd, error) {
	return client.NewStatd(a.runDir, client.Retry{})
}

// statdCall returns a statd client and a context bounded by --timeout;
// done releases both.
func (a *app) statdCall(cmd *cobra.Command) (*client.Statd, context.Context, func(), error) {
	c, err := a.statd()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := a.ctx(cmd)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

// eachName runs fn on every name a command was given. With one name its
// error is the command's; with several, each failure is printed, the
// other names are still done, and the status is the first failure's.
func (a *app) eachName(names []string, fn func(name string) error) error {
	if len(names) == 1 {
		return fn(names[0])
	}
	var first error
	for _, name := range names {
		if err := fn(name); err != nil {
			fmt.Fprintf(a.errOut, "error: %s\n", describe(err))
			if first == nil {
				first = err
			}
		}
	}
	if first != nil {
		return exitError{code: exitCode(first)}
	}
	return nil
}

// describe renders an error for humans: a gRPC status shows its message
// without the rpc error prefix.
func describe(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	var nf notFoundError
	if errors.As(err, &nf) {
		return exitNotFound
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange:
		return exitUsage
	case codes.NotFound:
		return exitNotFound
	case codes.Unavailable:
		return exitUnavailable
	}
	switch {
	case errdefs.IsInvalidArgument(err):
		return exitUsage
	case errdefs.IsNotFound(err):
		return exitNotFound
	case errdefs.IsUnavailable(err):
		return exitUnavailable
	}
	return exitFailure
}
