package ctl

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/secret"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

func (a *app) secretCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Cluster secrets, handed to services as read-only files",
		Long: `Secrets are small blobs (passwords, keys, certificates) that services read
as files: service create --secret NAME puts one at /run/secrets/NAME in
every task (NAME:FILE at /run/secrets/FILE, NAME:/path at /path). They are
sealed in cluster state with a key derived from the cluster CA, kept in
memory (tmpfs) on the nodes that run them, and never shown again by
shoalctl. A secret cannot change: create another and update the service.`,
	}
	cmd.AddCommand(a.secretCreate(), a.secretLs(), a.secretInspect(), a.secretRm())
	return cmd
}

type secretView struct {
	Name      string            `json:"name"`
	Size      int64             `json:"size"`
	Created   time.Time         `json:"created"`
	CreatedOn string            `json:"created_on"`
	Labels    map[string]string `json:"labels,omitempty"`
}

func secretViewOf(s *clusterv1.SecretInfo) secretView {
	return secretView{Name: s.GetName(), Size: s.GetSize(), Created: s.GetCreated().AsTime(), CreatedOn: s.GetCreatedOn(), Labels: s.GetLabels()}
}

func (a *app) secretCreate() *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:   "create NAME FILE",
		Short: "Create a secret from a file; - reads stdin",
		Example: `  shoalctl secret create db-pass ./db-pass.txt
  printf %s "$PASSWORD" | shoalctl secret create db-pass -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := secret.ValidName(name); err != nil {
				return usageError{err}
			}
			l := map[string]string{}
			for _, kv := range labels {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usageError{fmt.Errorf("--label %q: want KEY=VALUE", kv)}
				}
				l[k] = v
			}
			var r io.Reader = os.Stdin
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return usageError{err}
				}
				defer f.Close()
				r = f
			}
			// One byte past the limit tells too big from just right.
			data, err := io.ReadAll(io.LimitReader(r, secret.MaxSize+1))
			if err != nil {
				return usageError{err}
			}
			switch {
			case len(data) == 0:
				return usageError{fmt.Errorf("secret %s: %s is empty", name, args[1])}
			case len(data) > secret.MaxSize:
				return usageError{fmt.Errorf("secret %s: %s is more than %d bytes (500 KiB), the limit", name, args[1], secret.MaxSize)}
			}
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			info, err := c.Secrets.CreateSecret(ctx, &clusterv1.CreateSecretRequest{Name: name, Data: data, Labels: l})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "created secret %s (%s)\n", info.GetName(), bytesText(uint64(info.GetSize())))
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&labels, "label", nil, "secret label KEY=VALUE (repeatable)")
	return cmd
}

// secretViews lists the secrets, sorted by name.
func (a *app) secretViews(cmd *cobra.Command) ([]secretView, error) {
	c, ctx, done, err := a.statdCall(cmd)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := c.Secrets.ListSecrets(ctx, &clusterv1.ListSecretsRequest{})
	if err != nil {
		return nil, err
	}
	views := []secretView{}
	for _, s := range resp.GetSecrets() {
		views = append(views, secretViewOf(s))
	}
	sort.Slice(views, func(i, j int) bool { return views[i].Name < views[j].Name })
	return views, nil
}

func (a *app) secretLs() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List secrets (never their data)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			views, err := a.secretViews(cmd)
			if err != nil {
				return err
			}
			return render(a.out, format, views, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NAME\tSIZE\tCREATED\tON\tLABELS")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%s\t%s ago\t%s\t%s\n", v.Name, bytesText(uint64(v.Size)),
						time.Since(v.Created).Round(time.Second), v.CreatedOn, labelsText(v.Labels))
				}
			})
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func (a *app) secretInspect() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a secret's size, creation and labels (never its data)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			views, err := a.secretViews(cmd)
			if err != nil {
				return err
			}
			for _, v := range views {
				if v.Name != args[0] {
					continue
				}
				return render(a.out, format, v, func(tw *tabwriter.Writer) {
					fmt.Fprintf(tw, "NAME\t%s\nSIZE\t%s\nCREATED\t%s\nON\t%s\nLABELS\t%s\n",
						v.Name, bytesText(uint64(v.Size)), v.Created.Local().Format(time.RFC3339), v.CreatedOn, labelsText(v.Labels))
				})
			}
			return notFoundError{fmt.Errorf("secret %s does not exist (`shoalctl secret ls` lists them)", args[0])}
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func (a *app) secretRm() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove secrets no service uses",
		Long: `Removes secrets. Refused while a service's spec, or the previous spec a
rollback returns to, names the secret: remove the service, or update it
without the secret, first.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			return a.eachName(args, func(name string) error {
				if _, err := c.RemoveSecret(ctx, &schedv1.RemoveSecretRequest{Name: name}); err != nil {
					return err
				}
				fmt.Fprintf(a.out, "removed secret %s\n", name)
				return nil
			})
		},
	}
}
