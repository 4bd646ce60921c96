package ctl

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/sched"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// volumeUpdateCommand is `volume update`: set a volume's replica count and
// wait until its members are there.
func (a *app) volumeUpdateCommand() *cobra.Command {
	var (
		replicas int32
		size     string
		format   string
		w        waitFlags
	)
	cmd := &cobra.Command{
		Use:   "update NAME [--replicas R] [--size S]",
		Short: "Change a volume's size limit or how many replicas it has",
		Long: `Change a volume's size limit (--size: applied on every replica before
this returns; refused while the volume holds more, or when a member's
node lacks the room to grow it) or how many replicas it has (--replicas,
1 to 7; refused when too few live nodes can take the new replicas). A
refused update changes nothing.

The group's leader changes the replicas a step every repair round: new
replicas join as learners, catch up from a snapshot while writes go on,
and then vote; replicas removed are the ones on nodes that are down
first, then the newest, never the leader's. shoalctl waits until every
replica votes and holds what the leader committed, showing progress
(--detach returns at once; volume inspect shows where it is).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			scale := cmd.Flags().Changed("replicas")
			if !scale && size == "" {
				return usageError{fmt.Errorf("nothing to update: give --replicas or --size")}
			}
			if scale && replicas < 1 {
				return usageError{fmt.Errorf("--replicas %d: a volume needs at least one replica", replicas)}
			}
			var sizeBytes int64
			if size != "" {
				b, err := sched.ParseBytes(size)
				if err != nil || b <= 0 {
					return usageError{fmt.Errorf("--size %q: want a size such as 512Mi or 2G", size)}
				}
				sizeBytes = b
			}
			c, ctx, done, err := a.voldCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			name := args[0]
			v, err := c.Volumes.UpdateVolume(ctx, &volv1.UpdateVolumeRequest{Name: name, Replicas: replicas, SizeBytes: sizeBytes})
			if err != nil {
				return err
			}
			if scale && !w.detach {
				wctx, cancel := context.WithTimeout(cmd.Context(), w.timeout)
				defer cancel()
				p := newProgress(a.errOut)
				for {
					line, ok := scaleProgress(v, int(replicas))
					p.show(line)
					if ok {
						p.end()
						break
					}
					select {
					case <-wctx.Done():
						p.end()
						if cmd.Context().Err() != nil {
							return fmt.Errorf("interrupted while waiting; the change was made and goes on without shoalctl (see `shoalctl volume inspect %s`)", name)
						}
						return fmt.Errorf("volume %s did not reach %d replicas within %v (last: %s; the change goes on: see `shoalctl volume inspect %s`)", name, replicas, w.timeout, p.last, name)
					case <-time.After(500 * time.Millisecond):
					}
					ictx, icancel := context.WithTimeout(wctx, 10*time.Second)
					nv, err := c.Volumes.InspectVolume(ictx, &volv1.InspectVolumeRequest{Name: name})
					icancel()
					if err == nil {
						v = nv
					} else if wctx.Err() == nil {
						line, _ := scaleProgress(v, int(replicas))
						p.show(fmt.Sprintf("%s; inspect failed: %s", line, describe(err)))
					}
				}
			}
			return a.renderVolume(format, v)
		},
	}
	cmd.Flags().Int32Var(&replicas, "replicas", 0, "number of replicas wanted (1 to 7)")
	cmd.Flags().StringVar(&size, "size", "", "new size limit, e.g. 2Gi")
	cmd.Flags().BoolVarP(&w.detach, "detach", "d", false, "return once the count is set instead of waiting for the replicas")
	cmd.Flags().DurationVar(&w.timeout, "wait-timeout", 5*time.Minute, "give up waiting for the replicas after this long")
	outputFlag(cmd, &format)
	return cmd
}

// scaleProgress describes where a volume is on its way to want replicas,
// and reports whether it is there: want members, every one a voter that
// answers, and the volume healthy.
func scaleProgress(v *volv1.Volume, want int) (string, bool) {
	voting, pending := 0, []string{}
	for _, m := range v.GetMembers() {
		switch m.GetRole() {
		case "leader", "follower":
			voting++
		default:
			pending = append(pending, fmt.Sprintf("%s %s", m.GetNode(), dash(m.GetRole())))
		}
	}
	line := fmt.Sprintf("%s: %d of %d replicas voting, %s", v.GetName(), voting, want, dash(v.GetHealth()))
	if len(pending) > 0 {
		line += " (" + strings.Join(pending, ", ") + ")"
	}
	return line, voting == want && len(v.GetMembers()) == want && v.GetHealth() == "healthy"
}
