package ctl

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

func (a *app) imageCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Load, list and remove images (no registry needed)"}
	cmd.AddCommand(a.imageLoad(), a.imageLs(), a.imageRm(), a.imagePrune())
	return cmd
}

func (a *app) imageLoad() *cobra.Command {
	return &cobra.Command{
		Use:   "load FILE",
		Short: "Load an image archive (OCI layout or docker save tarball); - reads stdin",
		Long: `Loads an image into this node. Nodes that lack it fetch it from a node that
has it, by digest, when a task needs it: loading once serves the cluster.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return usageError{err}
				}
				defer f.Close()
				r = f
			}
			c, err := a.schedd()
			if err != nil {
				return err
			}
			defer c.Close()
			stream, err := c.LoadImage(cmd.Context())
			if err != nil {
				return err
			}
			buf := make([]byte, 1<<20)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					if serr := stream.Send(&schedv1.ImageChunk{Data: buf[:n]}); serr != nil {
						break // the server's error comes with CloseAndRecv
					}
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					return err
				}
			}
			resp, err := stream.CloseAndRecv()
			if err != nil {
				return err
			}
			for _, img := range resp.GetImages() {
				fmt.Fprintf(a.out, "loaded %s (%s, %s)\n", img.GetName(), img.GetDigest(), bytesText(uint64(img.GetSize())))
			}
			return nil
		},
	}
}

type imageView struct {
	Name   string   `json:"name"`
	Digest string   `json:"digest"`
	Size   int64    `json:"size"`
	Nodes  []string `json:"nodes"`
}

func (a *app) imageLs() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List images on this node and the nodes that hold them",
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
			resp, err := c.ListImages(ctx, &schedv1.ListImagesRequest{})
			if err != nil {
				return err
			}
			views := []imageView{}
			for _, i := range resp.GetImages() {
				views = append(views, imageView{Name: i.GetName(), Digest: i.GetDigest(), Size: i.GetSize(), Nodes: i.GetNodes()})
			}
			sort.Slice(views, func(i, j int) bool { return views[i].Name < views[j].Name })
			return render(a.out, format, views, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tNODES")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, short(v.Digest), bytesText(uint64(v.Size)), strings.Join(v.Nodes, ","))
				}
			})
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "Name")
	return cmd
}

// removeWait is how long RemoveImage may wait for the holders: the
// server's default, less if --timeout is short, leaving the answer time to
// come back before the call ends.
func (a *app) removeWait() time.Duration {
	return min(10*time.Second, max(a.timeout-2*time.Second, a.timeout/2))
}

type removedImageView struct {
	Name        string   `json:"name"`
	Digest      string   `json:"digest"`
	RemovedFrom []string `json:"removed_from"`
	Pending     []string `json:"pending,omitempty"`
}

func (a *app) imageRm() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "rm IMAGE...",
		Short: "Remove images from every node",
		Long: `Removes images, by name or digest, from every node that holds them; their
blobs are freed. An image goes with all its names (one digest). Refused
while a service's spec, or the previous spec a rollback returns to, names
the image. A node that is down drops its copy when it runs again.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			wait := a.removeWait()
			views := []removedImageView{}
			failed := a.eachName(args, func(ref string) error {
				resp, err := c.RemoveImage(ctx, &schedv1.RemoveImageRequest{Ref: ref, Wait: durationpb.New(wait)})
				if err != nil {
					return err
				}
				views = append(views, removedImageView{Name: resp.GetName(), Digest: resp.GetDigest(), RemovedFrom: nonNil(resp.GetRemovedFrom()), Pending: resp.GetPending()})
				return nil
			})
			if failed != nil && len(args) == 1 {
				return failed
			}
			if err := render(a.out, format, views, func(tw *tabwriter.Writer) {
				for _, v := range views {
					fmt.Fprintf(tw, "removed %s (%s) from %s\n", v.Name, short(v.Digest), nodesText(v.RemovedFrom))
					if len(v.Pending) > 0 {
						fmt.Fprintf(tw, "  still on %s: dropped when it runs again\n", strings.Join(v.Pending, ", "))
					}
				}
			}); err != nil {
				return err
			}
			return failed
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

// nodesText lists nodes for a sentence.
func nodesText(ids []string) string {
	if len(ids) == 0 {
		return "no node"
	}
	return strings.Join(ids, ", ")
}

// prunedImagesView is what image prune did.
type prunedImagesView struct {
	Removed []removedImageView `json:"removed"`
	// Kept are the images a service still names, with why.
	Kept []keptImageView `json:"kept"`
}

type keptImageView struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	Reason string `json:"reason"`
}

func (a *app) imagePrune() *cobra.Command {
	var format string
	var force bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove every image no service names, from every node",
		Long: `Removes, as image rm does, every image of the cluster that no service's
spec (nor the previous spec a rollback returns to) names; the others are
kept and listed. Asks first on a terminal; -f does not ask (needed when
stdin is not a terminal).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			if !force {
				if !term.IsTerminal(int(os.Stdin.Fd())) {
					return usageError{fmt.Errorf("image prune removes images from every node: give -f to confirm (stdin is not a terminal to ask)")}
				}
				fmt.Fprint(a.errOut, "Remove every image no service names, from every node? [y/N] ")
				var answer string
				fmt.Fscanln(os.Stdin, &answer)
				if ans := strings.ToLower(strings.TrimSpace(answer)); ans != "y" && ans != "yes" {
					return fmt.Errorf("nothing removed")
				}
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.ListImages(ctx, &schedv1.ListImagesRequest{})
			if err != nil {
				return err
			}
			wait := a.removeWait()
			view := prunedImagesView{Removed: []removedImageView{}, Kept: []keptImageView{}}
			var failed error
			for _, img := range resp.GetImages() {
				r, err := c.RemoveImage(ctx, &schedv1.RemoveImageRequest{Ref: img.GetDigest(), Wait: durationpb.New(wait)})
				switch {
				case status.Code(err) == codes.FailedPrecondition:
					view.Kept = append(view.Kept, keptImageView{Name: img.GetName(), Digest: img.GetDigest(), Reason: status.Convert(err).Message()})
				case status.Code(err) == codes.NotFound:
					// Removed meanwhile.
				case err != nil:
					fmt.Fprintf(a.errOut, "error: %s: %s\n", img.GetName(), describe(err))
					failed = cmp.Or(failed, error(exitError{code: exitCode(err)}))
				default:
					view.Removed = append(view.Removed, removedImageView{Name: r.GetName(), Digest: r.GetDigest(), RemovedFrom: nonNil(r.GetRemovedFrom()), Pending: r.GetPending()})
				}
			}
			if err := render(a.out, format, view, func(tw *tabwriter.Writer) {
				for _, v := range view.Removed {
					fmt.Fprintf(tw, "removed %s (%s) from %s\n", v.Name, short(v.Digest), nodesText(v.RemovedFrom))
				}
				for _, v := range view.Kept {
					fmt.Fprintf(tw, "kept %s (%s): in use\n", v.Name, short(v.Digest))
				}
				if len(view.Removed) == 0 {
					fmt.Fprintln(tw, "no image to remove")
				}
			}); err != nil {
				return err
			}
			return failed
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "do not ask")
	outputFlag(cmd, &format)
	return cmd
}
