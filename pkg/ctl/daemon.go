package ctl

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/client"
)

func (a *app) daemonCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "daemon", Short: "Inspect the local Shoal daemons"}
	var format string
	status := &cobra.Command{
		Use:   "status",
		Short: "Show whether each local daemon is reachable, its version and uptime",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			rows := a.daemonStatus(ctx)
			return render(a.out, format, rows, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "DAEMON\tREACHABLE\tVERSION\tUPTIME\tPID\tDETAILS")
				for _, r := range rows {
					if !r.Reachable {
						fmt.Fprintf(tw, "%s\tno\t-\t-\t-\t%s\n", r.Name, r.Error)
						continue
					}
					fmt.Fprintf(tw, "%s\tyes\t%s\t%s\t%d\t%s\n", r.Name, r.Version, r.Uptime, r.PID, joinDetails(r.Details))
				}
			})
		},
	}
	outputFlag(status, &format)
	cmd.AddCommand(status)
	return cmd
}

type daemonRow struct {
	Name      string            `json:"name"`
	Socket    string            `json:"socket"`
	Reachable bool              `json:"reachable"`
	Ready     bool              `json:"ready,omitempty"`
	Version   string            `json:"version,omitempty"`
	Started   *time.Time        `json:"started,omitempty"`
	Uptime    string            `json:"uptime,omitempty"`
	PID       int64             `json:"pid,omitempty"`
	Details   map[string]string `json:"details,omitempty"`
	Error     string            `json:"error,omitempty"`
}

// infoTimeout bounds each daemon's answer to `daemon status`.
const infoTimeout = 2 * time.Second

// daemonStatus asks every daemon for Info in parallel, without retrying:
// a status command should report what is, not wait for it to change.
func (a *app) daemonStatus(ctx context.Context) []daemonRow {
	rows := make([]daemonRow, len(client.Daemons))
	done := make(chan struct{})
	for i, name := range client.Daemons {
		go func() {
			defer func() { done <- struct{}{} }()
			rows[i] = daemonRow{Name: name, Socket: a.runDir + "/" + name + ".sock"}
			conn, err := client.Dial(a.runDir, name, client.Retry{Attempts: 1})
			if err != nil {
				rows[i].Error = err.Error()
				return
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, infoTimeout)
			defer cancel()
			info, err := client.Info(cctx, conn)
			if err != nil {
				// A daemon that accepts the call but does not answer is
				// running but stuck, not absent: say which.
				rows[i].Error = "not reachable at " + rows[i].Socket
				if status.Code(err) == codes.DeadlineExceeded {
					rows[i].Error = fmt.Sprintf("no answer within %v at %s", infoTimeout, rows[i].Socket)
				}
				return
			}
			started := info.GetStarted().AsTime()
			rows[i].Reachable = true
			rows[i].Ready = info.GetReady()
			rows[i].Version = info.GetVersion()
			rows[i].Started = &started
			rows[i].Uptime = time.Since(started).Round(time.Second).String()
			rows[i].PID = info.GetPid()
			rows[i].Details = info.GetDetails()
		}()
	}
	for range client.Daemons {
		<-done
	}
	return rows
}

func joinDetails(d map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(d)) {
		parts = append(parts, k+"="+d[k])
	}
	return strings.Join(parts, " ")
}
