package ctl

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/dockerauth"
	"github.com/shoal-dev/shoal/pkg/secret"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

func (a *app) registryCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "registry",
		Short: "Registry credentials for the whole cluster's pulls",
		Long: `A registry's credentials, given once with registry login, are what every
node's schedd uses to pull images from it (Swarm's --with-registry-auth,
for every service). They are kept as a secret of the cluster (sealed,
labelled io.shoal.registry=HOST); a node's own registry_auth file is used
for registries they do not name.`,
	}
	cmd.AddCommand(a.registryLogin(), a.registryLogout(), a.registryLs())
	return cmd
}

// registryHost checks a registry named as a pull names it: host[:port].
func registryHost(s string) (string, error) {
	if s == "" || strings.Contains(s, "/") || strings.ContainsAny(s, " \t@") {
		return "", usageError{fmt.Errorf("registry %q: want HOST[:PORT], e.g. ghcr.io or 10.0.0.5:5000 (no scheme, no path)", s)}
	}
	return s, nil
}

// registrySecrets are the secrets holding host's credentials.
func (a *app) registrySecrets(cmd *cobra.Command, host string) ([]*clusterv1.SecretInfo, error) {
	c, ctx, done, err := a.statdCall(cmd)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := c.Secrets.ListSecrets(ctx, &clusterv1.ListSecretsRequest{})
	if err != nil {
		return nil, err
	}
	var out []*clusterv1.SecretInfo
	for _, s := range resp.GetSecrets() {
		if h, ok := s.GetLabels()[secret.RegistryLabel]; ok && (host == "" || h == host) {
			out = append(out, s)
		}
	}
	return out, nil
}

// removeRegistrySecrets removes secrets through schedd, which refuses
// to remove one a service uses.
func (a *app) removeRegistrySecrets(cmd *cobra.Command, secrets []*clusterv1.SecretInfo) error {
	if len(secrets) == 0 {
		return nil
	}
	c, ctx, done, err := a.scheddCall(cmd)
	if err != nil {
		return err
	}
	defer done()
	for _, s := range secrets {
		if _, err := c.RemoveSecret(ctx, &schedv1.RemoveSecretRequest{Name: s.GetName()}); err != nil {
			return fmt.Errorf("remove the old credentials (secret %s): %w", s.GetName(), err)
		}
	}
	return nil
}

// storeRegistryCredentials stores host's credentials for every node's
// pulls, replacing those stored before; it returns the secret's name.
func (a *app) storeRegistryCredentials(cmd *cobra.Command, host, user, password string) (string, error) {
	data, err := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{
		"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))}}})
	if err != nil {
		return "", err
	}
	old, err := a.registrySecrets(cmd, host)
	if err != nil {
		return "", err
	}
	c, ctx, done, err := a.statdCall(cmd)
	if err != nil {
		return "", err
	}
	defer done()
	// A secret cannot change: the new one is made beside the old, which
	// goes once it is stored, so no pull meanwhile goes without (schedd
	// takes a registry's newest).
	name := freeRegistryName(host, old)
	if _, err := c.Secrets.CreateSecret(ctx, &clusterv1.CreateSecretRequest{Name: name, Data: data,
		Labels: map[string]string{secret.RegistryLabel: host}}); err != nil {
		return "", fmt.Errorf("store the credentials (secret %s): %w", name, err)
	}
	if err := a.removeRegistrySecrets(cmd, old); err != nil {
		return "", fmt.Errorf("the new credentials are stored (secret %s), but not all old ones went: %w", name, err)
	}
	return name, nil
}

// freeRegistryName names the secret of host's credentials apart from
// those it replaces: secret.RegistryName, with a number when that is
// taken.
func freeRegistryName(host string, old []*clusterv1.SecretInfo) string {
	taken := map[string]bool{}
	for _, s := range old {
		taken[s.GetName()] = true
	}
	base := secret.RegistryName(host)
	if !taken[base] {
		return base
	}
	for i := 2; ; i++ {
		suffix := fmt.Sprintf("-%d", i)
		if name := base[:min(len(base), 64-len(suffix))] + suffix; !taken[name] {
			return name
		}
	}
}

// registryOf is the registry an image reference names, if it names one
// (a bare name is local to the cluster, never pulled).
func registryOf(ref string) (string, bool) {
	first, _, ok := strings.Cut(ref, "/")
	if !ok || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return "", false
	}
	return first, true
}

// forwardRegistryAuth is --with-registry-auth: the credentials this
// user's docker login saved for the registries of images are stored for
// every node's pulls, as registry login would.
func (a *app) forwardRegistryAuth(cmd *cobra.Command, images []string) error {
	path, err := dockerauth.ConfigPath()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return usageError{fmt.Errorf("--with-registry-auth: %w (log in with docker login, or use shoalctl registry login)", err)}
	}
	seen := map[string]bool{}
	for _, ref := range images {
		host, ok := registryOf(ref)
		if !ok || seen[host] {
			continue
		}
		seen[host] = true
		user, password, found, from, err := dockerCredentials(data, path, host)
		if err != nil {
			return usageError{fmt.Errorf("--with-registry-auth: %w", err)}
		}
		if !found || user == "" {
			fmt.Fprintf(a.errOut, "warning: --with-registry-auth: %s holds no credentials of %s; the cluster's stay as they are\n", from, host)
			continue
		}
		if _, err := a.storeRegistryCredentials(cmd, host, user, password); err != nil {
			return err
		}
		fmt.Fprintf(a.errOut, "credentials of %s from %s stored for every node's pulls\n", host, from)
	}
	return nil
}

// dockerCredentials finds host's credentials as docker would with the
// login file data read from path: from the credential helper it names for
// host, else from its auths; from says where it looked.
func dockerCredentials(data []byte, path, host string) (user, password string, found bool, from string, err error) {
	helper, err := dockerauth.Helper(data, host)
	if err != nil {
		return "", "", false, path, fmt.Errorf("%s: %w", path, err)
	}
	if helper != "" {
		from = "docker-credential-" + helper + " (named by " + path + ")"
		user, password, found, err = dockerauth.FromHelper(helper, host)
		return user, password, found, from, err
	}
	user, password, found, err = dockerauth.Credentials(data, host)
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
	}
	return user, password, found, path, err
}

func (a *app) registryLogin() *cobra.Command {
	var user, password string
	var passwordStdin bool
	cmd := &cobra.Command{
		Use:   "login HOST -u USER (--password-stdin | -p PASSWORD)",
		Short: "Store a registry's credentials for every node's pulls",
		Example: `  printf %s "$TOKEN" | shoalctl registry login ghcr.io -u deploy --password-stdin
  shoalctl registry login 10.0.0.5:5000 -u puller -p secret`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			host, err := registryHost(args[0])
			if err != nil {
				return err
			}
			switch {
			case user == "":
				return usageError{errors.New("--username is required")}
			case passwordStdin && password != "":
				return usageError{errors.New("--password and --password-stdin: give one")}
			case passwordStdin:
				b, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
				if err != nil {
					return err
				}
				password = strings.TrimRight(string(b), "\r\n")
			}
			if password == "" {
				return usageError{errors.New("no password: give --password-stdin (or --password)")}
			}
			name, err := a.storeRegistryCredentials(cmd, host, user, password)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "credentials of %s stored for every node's pulls (secret %s)\n", host, name)
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "username", "u", "", "user name")
	cmd.Flags().StringVarP(&password, "password", "p", "", "password (seen by other users of this machine in the process list: prefer --password-stdin)")
	cmd.Flags().BoolVar(&passwordStdin, "password-stdin", false, "read the password from stdin")
	return cmd
}

func (a *app) registryLogout() *cobra.Command {
	return &cobra.Command{
		Use:   "logout HOST",
		Short: "Remove a registry's credentials: pulls from it go anonymous (or use a node's file)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			host, err := registryHost(args[0])
			if err != nil {
				return err
			}
			old, err := a.registrySecrets(cmd, host)
			if err != nil {
				return err
			}
			if len(old) == 0 {
				return notFoundError{fmt.Errorf("no credentials of %s are stored", host)}
			}
			if err := a.removeRegistrySecrets(cmd, old); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "credentials of %s removed\n", host)
			return nil
		},
	}
}

// registryView is a line of registry ls.
type registryView struct {
	Host    string    `json:"host"`
	Secret  string    `json:"secret"`
	Created time.Time `json:"created"`
}

func (a *app) registryLs() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the registries whose credentials are stored (never the credentials)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			secrets, err := a.registrySecrets(cmd, "")
			if err != nil {
				return err
			}
			views := []registryView{}
			for _, s := range secrets {
				views = append(views, registryView{Host: s.GetLabels()[secret.RegistryLabel], Secret: s.GetName(), Created: s.GetCreated().AsTime()})
			}
			slices.SortFunc(views, func(x, y registryView) int { return strings.Compare(x.Host, y.Host) })
			return render(a.out, format, views, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "REGISTRY\tSECRET\tCREATED")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%s\t%s ago\n", v.Host, v.Secret, time.Since(v.Created).Round(time.Second))
				}
			})
		},
	}
	outputFlag(cmd, &format)
	return cmd
}
