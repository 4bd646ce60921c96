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

// fileObject is what a command is about: secrets, or configs (Docker
// Swarm's configs: the same files for services, without the secrecy).
type fileObject struct {
	noun   string
	config bool
}

var (
	secretObject = fileObject{noun: "secret"}
	configObject = fileObject{noun: "config", config: true}
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
	cmd.AddCommand(a.secretCreate(secretObject), a.secretLs(secretObject), a.secretInspect(secretObject), a.secretRm(secretObject))
	return cmd
}

func (a *app) configCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Cluster configs, handed to services as read-only files",
		Long: `Configs are files services read (an nginx.conf, say) kept in cluster state
in plain text: service create --config NAME puts one at /NAME in every
task (NAME:FILE at /FILE, NAME:/path at /path), as Docker Swarm does. A
config cannot change: create another and update the service. For
passwords and keys, use secrets.`,
	}
	cmd.AddCommand(a.secretCreate(configObject), a.secretLs(configObject), a.secretInspect(configObject), a.secretRm(configObject))
	return cmd
}

type secretView struct {
	Name      string            `json:"name"`
	Size      int64             `json:"size"`
	Created   time.Time         `json:"created"`
	CreatedOn string            `json:"created_on"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Data is a config's, in `config inspect` only (never a secret's).
	Data string `json:"data,omitempty"`
}

func secretViewOf(s *clusterv1.SecretInfo) secretView {
	return secretView{Name: s.GetName(), Size: s.GetSize(), Created: s.GetCreated().AsTime(), CreatedOn: s.GetCreatedOn(), Labels: s.GetLabels()}
}

func (a *app) secretCreate(o fileObject) *cobra.Command {
	var labels []string
	example := `  shoalctl secret create db-pass ./db-pass.txt
  printf %s "$PASSWORD" | shoalctl secret create db-pass -`
	if o.config {
		example = `  shoalctl config create nginx.conf ./nginx.conf`
	}
	cmd := &cobra.Command{
		Use:     "create NAME FILE",
		Short:   "Create a " + o.noun + " from a file; - reads stdin",
		Example: example,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := secret.ValidName(name); err != nil {
				return usageError{fmt.Errorf("%s %w", o.noun, err)}
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
				return usageError{fmt.Errorf("%s %s: %s is empty", o.noun, name, args[1])}
			case len(data) > secret.MaxSize:
				return usageError{fmt.Errorf("%s %s: %s is more than %d bytes (500 KiB), the limit", o.noun, name, args[1], secret.MaxSize)}
			}
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			info, err := c.Secrets.CreateSecret(ctx, &clusterv1.CreateSecretRequest{Name: name, Data: data, Labels: l, Config: o.config})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "created %s %s (%s)\n", o.noun, info.GetName(), bytesText(uint64(info.GetSize())))
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&labels, "label", nil, o.noun+" label KEY=VALUE (repeatable)")
	return cmd
}

// secretViews lists the secrets (or configs), sorted by name.
func (a *app) secretViews(cmd *cobra.Command, o fileObject) ([]secretView, error) {
	c, ctx, done, err := a.statdCall(cmd)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := c.Secrets.ListSecrets(ctx, &clusterv1.ListSecretsRequest{Configs: o.config})
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

// secretView is secret (or config) name, with a config's data: a
// secret's data does not even leave statd.
func (a *app) secretView(cmd *cobra.Command, o fileObject, name string) (secretView, error) {
	if o.config {
		c, ctx, done, err := a.statdCall(cmd)
		if err != nil {
			return secretView{}, err
		}
		defer done()
		resp, err := c.Secrets.ReadSecret(ctx, &clusterv1.ReadSecretRequest{Name: name, Config: true})
		if err != nil {
			return secretView{}, err
		}
		v := secretViewOf(resp.GetInfo())
		v.Data = string(resp.GetData())
		return v, nil
	}
	views, err := a.secretViews(cmd, o)
	if err != nil {
		return secretView{}, err
	}
	for _, v := range views {
		if v.Name == name {
			return v, nil
		}
	}
	return secretView{}, notFoundError{fmt.Errorf("secret %s does not exist (`shoalctl secret ls` lists them)", name)}
}

func (a *app) secretLs(o fileObject) *cobra.Command {
	var format string
	var filters []string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List " + o.noun + "s, without their data",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			views, err := a.secretViews(cmd, o)
			if err != nil {
				return err
			}
			if views, err = applyFilter(filters, secretFilters, views); err != nil {
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
	quietFlag(cmd, &format, "Name")
	filterFlag(cmd, &filters, secretFilters)
	return cmd
}

func (a *app) secretInspect(o fileObject) *cobra.Command {
	var format string
	short := "Show a secret's size, creation and labels (never its data)"
	if o.config {
		short = "Show a config: its size, creation, labels and data"
	}
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			v, err := a.secretView(cmd, o, args[0])
			if err != nil {
				return err
			}
			return render(a.out, format, v, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "NAME\t%s\nSIZE\t%s\nCREATED\t%s\nON\t%s\nLABELS\t%s\n",
					v.Name, bytesText(uint64(v.Size)), v.Created.Local().Format(time.RFC3339), v.CreatedOn, labelsText(v.Labels))
				if o.config {
					fmt.Fprintf(tw, "DATA\n%s", v.Data)
				}
			})
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func (a *app) secretRm(o fileObject) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove " + o.noun + "s no service uses",
		Long: fmt.Sprintf(`Removes %[1]ss. Refused while a service's spec, or the previous spec a
rollback returns to, names the %[1]s: remove the service, or update it
without the %[1]s, first.`, o.noun),
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			return a.eachName(args, func(name string) error {
				if _, err := c.RemoveSecret(ctx, &schedv1.RemoveSecretRequest{Name: name, Config: o.config}); err != nil {
					return err
				}
				fmt.Fprintf(a.out, "removed %s %s\n", o.noun, name)
				return nil
			})
		},
	}
}
