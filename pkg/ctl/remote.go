package ctl

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/rpc"
)

// hostEnv is where --host defaults from, as DOCKER_HOST.
const hostEnv = "SHOAL_HOST"

// useHost points the command at another node's daemons when --host names
// one (ssh://[user@]host[:port]): its run dir becomes the ssh:// form
// the clients dial through ssh, with --run-dir, if given, the run dir on
// that node.
func (a *app) useHost(cmd *cobra.Command, host string) error {
	if host == "" {
		return nil
	}
	remoteDir := ""
	if cmd.Flags().Changed("run-dir") {
		remoteDir = a.runDir
	}
	runDir, err := client.SSHRunDir(host, remoteDir)
	if err != nil {
		return usageError{err}
	}
	a.runDir = runDir
	return nil
}

// dialStdio is what an ssh:// client runs on the node it reaches: it joins
// its standard input and output to a local daemon's socket.
func (a *app) dialStdio() *cobra.Command {
	return &cobra.Command{
		Use:    "dial-stdio DAEMON",
		Short:  "Join standard input and output to a local daemon's socket (what shoalctl --host runs through ssh)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !slices.Contains(client.Daemons, name) {
				return usageError{fmt.Errorf("daemon %q: want one of %s", name, strings.Join(client.Daemons, ", "))}
			}
			if strings.Contains(a.runDir, "://") {
				return usageError{errors.New("dial-stdio joins a daemon of this node: no --host")}
			}
			conn, err := rpc.DialUnix(client.SocketPath(a.runDir, name))(cmd.Context(), "")
			if err != nil {
				return fmt.Errorf("shoal-%s: %w", name, err)
			}
			defer conn.Close()
			go func() {
				io.Copy(conn, cmd.InOrStdin())
				// The client is done sending: let the daemon see the end,
				// and keep reading its answers.
				conn.(*net.UnixConn).CloseWrite()
			}()
			_, err = io.Copy(a.out, conn)
			if f, ok := a.out.(*os.File); ok {
				f.Close()
			}
			return err
		},
	}
}
