package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/secret"
	"github.com/shoal-dev/shoal/pkg/stack"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

func (a *app) stackCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stack",
		Short: "Deploy Compose files as stacks of services",
		Long: `A stack is the services of a Compose file, deployed together as Docker
Swarm's docker stack deploy does: service web of stack app is the service
app-web, which the stack's tasks also reach by the name web. Secrets,
configs and named volumes the file defines are created with the stack
(app_KEY, app_KEY and app-KEY); external ones must exist.`,
	}
	cmd.AddCommand(a.stackDeploy(), a.stackLs(), a.stackServices(), a.stackPs(), a.stackRm())
	return cmd
}

func (a *app) stackDeploy() *cobra.Command {
	var files []string
	var prune, dryRun, withRegistryAuth bool
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "deploy NAME -c FILE [-c FILE...]",
		Short: "Create or update a stack from Compose files",
		Long: `Deploys the services of the Compose files (later files override earlier
ones; ${VAR} is taken from the environment and a .env file beside the
first) as stack NAME. A service the files do not change is left alone;
one they change is updated by a rolling update. Services of the stack the
files no longer name are kept unless --prune is given. The files are
checked whole, every problem reported at once, before anything is
changed; then what only the cluster can judge (an image no node has, a
port another service publishes, an external secret or volume that does
not exist), for every service, still before anything is changed.
--dry-run stops there and prints what the deploy would do.`,
		Example: `  shoalctl stack deploy app -c compose.yml
  shoalctl stack deploy app -c compose.yml --dry-run`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := stack.ValidName(name); err != nil {
				return usageError{err}
			}
			if len(files) == 0 {
				return usageError{fmt.Errorf("-c FILE is required")}
			}
			opts, err := cli.NewProjectOptions(files, cli.WithName(name), cli.WithOsEnv, cli.WithDotEnv)
			if err != nil {
				return usageError{err}
			}
			project, err := opts.LoadProject(cmd.Context())
			if err != nil {
				return usageError{err}
			}
			plan, err := stack.Convert(project, name)
			if err != nil {
				return usageError{err}
			}
			for _, warning := range plan.Warnings {
				fmt.Fprintf(a.errOut, "warning: %s\n", warning)
			}
			secrets, err := fileData(secretObject, plan.Secrets)
			if err != nil {
				return usageError{err}
			}
			configs, err := fileData(configObject, plan.Configs)
			if err != nil {
				return usageError{err}
			}
			d, err := a.newStackDeployer(cmd, plan)
			if err != nil {
				return err
			}
			defer d.close()
			// Everything is checked before anything is made: a
			// deploy that fails leaves the cluster as it was
			// (unless the cluster changes in between).
			newSecrets, err := d.checkFiles(secretObject, plan.Secrets, secrets)
			if err != nil {
				return err
			}
			newConfigs, err := d.checkFiles(configObject, plan.Configs, configs)
			if err != nil {
				return err
			}
			newVolumes, err := d.checkVolumes()
			if err != nil {
				return err
			}
			checked, err := d.checkServices(newSecrets, newConfigs, dryRun)
			if err != nil {
				return err
			}
			if dryRun {
				return d.printPlan(newSecrets, newConfigs, newVolumes, checked, prune)
			}
			if withRegistryAuth {
				var images []string
				for _, s := range plan.Services {
					images = append(images, s.Image)
				}
				if err := a.forwardRegistryAuth(cmd, images); err != nil {
					return err
				}
			}
			if err := d.createFiles(secretObject, newSecrets, secrets); err != nil {
				return err
			}
			if err := d.createFiles(configObject, newConfigs, configs); err != nil {
				return err
			}
			if err := d.createVolumes(newVolumes); err != nil {
				return err
			}
			changed, err := d.services(prune)
			if err != nil {
				return err
			}
			for _, s := range changed {
				if err := a.waitService(cmd, d.schedd, s.GetName(), s.GetVersion(), w, s.GetVersion() > 1); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "compose-file", "c", nil, "Compose file (repeatable; - reads stdin)")
	cmd.Flags().BoolVar(&prune, "prune", false, "remove the stack's services the files no longer name")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "check everything and print what the deploy would do, changing nothing")
	cmd.Flags().BoolVar(&withRegistryAuth, "with-registry-auth", false, "store the credentials docker login saved here for the images' registries, for every node's pulls (as shoalctl registry login)")
	w.bind(cmd.Flags())
	return cmd
}

// fileData reads the data of the secrets (or configs) a stack creates,
// before anything is changed: a missing file fails the deploy whole.
func fileData(o fileObject, files []stack.File) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, s := range files {
		if s.External {
			continue
		}
		var data []byte
		switch {
		case s.File != "":
			b, err := os.ReadFile(s.File)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", o.noun, s.Key, err)
			}
			data = b
		case s.Env != "":
			v, ok := os.LookupEnv(s.Env)
			if !ok {
				return nil, fmt.Errorf("%s %s: environment variable %s is not set", o.noun, s.Key, s.Env)
			}
			data = []byte(v)
		default:
			data = []byte(s.Content)
		}
		if len(data) == 0 || len(data) > secret.MaxSize {
			return nil, fmt.Errorf("%s %s: %d bytes; a %s holds 1 byte to 500 KiB", o.noun, s.Key, len(data), o.noun)
		}
		out[s.Name] = data
	}
	return out, nil
}

// stackDeployer applies a plan through the daemons of this node.
type stackDeployer struct {
	a      *app
	cmd    *cobra.Command
	plan   stack.Plan
	statd  *client.Statd
	schedd *client.Schedd
}

func (a *app) newStackDeployer(cmd *cobra.Command, plan stack.Plan) (*stackDeployer, error) {
	st, err := a.statd()
	if err != nil {
		return nil, err
	}
	sc, err := a.schedd()
	if err != nil {
		st.Close()
		return nil, err
	}
	return &stackDeployer{a: a, cmd: cmd, plan: plan, statd: st, schedd: sc}, nil
}

func (d *stackDeployer) close() {
	d.statd.Close()
	d.schedd.Close()
}

// checkFiles returns the names of the stack's secrets (or configs) that
// do not exist yet, and checks that the others hold what the files say:
// neither can change, so a changed one must get a new name.
func (d *stackDeployer) checkFiles(o fileObject, files []stack.File, data map[string][]byte) ([]string, error) {
	ctx, cancel := d.a.ctx(d.cmd)
	defer cancel()
	var missing []string
	for _, s := range files {
		cur, err := d.statd.Secrets.ReadSecret(ctx, &clusterv1.ReadSecretRequest{Name: s.Name, Config: o.config})
		switch {
		case status.Code(err) == codes.NotFound && s.External:
			return nil, fmt.Errorf("%s %s is external but does not exist: create it with `shoalctl %s create %s FILE`", o.noun, s.Name, o.noun, s.Name)
		case status.Code(err) == codes.NotFound:
			missing = append(missing, s.Name)
		case err != nil:
			return nil, fmt.Errorf("%s %s: %w", o.noun, s.Name, err)
		case !s.External && !bytes.Equal(cur.GetData(), data[s.Name]):
			return nil, fmt.Errorf("%[1]s %[2]s changed, and a %[1]s cannot change: give it a new name in the file (name: %[2]s_v2, say); the services then get the new one by a rolling update", o.noun, s.Name)
		}
	}
	return missing, nil
}

// createFiles creates the secrets (or configs) names, labelled as the
// stack's.
func (d *stackDeployer) createFiles(o fileObject, names []string, data map[string][]byte) error {
	ctx, cancel := d.a.ctx(d.cmd)
	defer cancel()
	for _, name := range names {
		if _, err := d.statd.Secrets.CreateSecret(ctx, &clusterv1.CreateSecretRequest{
			Name: name, Data: data[name], Labels: map[string]string{stack.LabelStack: d.plan.Stack}, Config: o.config,
		}); err != nil {
			return fmt.Errorf("%s %s: %w", o.noun, name, err)
		}
		fmt.Fprintf(d.a.errOut, "%s %s created\n", o.noun, name)
	}
	return nil
}

// checkVolumes returns the stack's volumes that do not exist yet, and
// fails for an external one that does not.
func (d *stackDeployer) checkVolumes() ([]stack.Volume, error) {
	if len(d.plan.Volumes) == 0 {
		return nil, nil
	}
	c, ctx, done, err := d.a.voldCall(d.cmd)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := c.Volumes.ListVolumes(ctx, &volv1.ListVolumesRequest{})
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, v := range resp.GetVolumes() {
		have[v.GetName()] = true
	}
	var missing []stack.Volume
	for _, v := range d.plan.Volumes {
		switch {
		case have[v.Name]:
		case v.External:
			return nil, fmt.Errorf("volume %s is external but does not exist: create it with `shoalctl volume create %s`", v.Name, v.Name)
		default:
			missing = append(missing, v)
		}
	}
	return missing, nil
}

// createVolumes creates volumes.
func (d *stackDeployer) createVolumes(volumes []stack.Volume) error {
	if len(volumes) == 0 {
		return nil
	}
	c, ctx, done, err := d.a.voldCall(d.cmd)
	if err != nil {
		return err
	}
	defer done()
	for _, v := range volumes {
		if _, err := c.Volumes.CreateVolume(ctx, &volv1.CreateVolumeRequest{Name: v.Name, Replicas: v.Replicas, SizeBytes: v.SizeBytes}); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		fmt.Fprintf(d.a.errOut, "volume %s created\n", v.Name)
	}
	return nil
}

// checkServices asks schedd to check each of the plan's services as its
// deploy would, the secrets and configs the deploy creates counted as
// there, and reports every service that would fail; it returns the
// services as the deploy would leave them. A schedd too old to check
// (Unimplemented) leaves the checks to the deploy itself, which a dry run
// cannot.
func (d *stackDeployer) checkServices(newSecrets, newConfigs []string, dryRun bool) ([]*schedv1.Service, error) {
	ctx, cancel := d.a.ctx(d.cmd)
	defer cancel()
	var problems []string
	var out []*schedv1.Service
	code := codes.OK
	for _, spec := range d.plan.Services {
		data, err := checkSpec(spec)
		if err != nil {
			return nil, err
		}
		svc, err := d.schedd.CheckDeploy(ctx, &schedv1.CheckDeployRequest{Spec: data, NewSecrets: newSecrets, NewConfigs: newConfigs})
		switch {
		case status.Code(err) == codes.Unimplemented && dryRun:
			return nil, fmt.Errorf("this node's schedd is too old to check a deploy: --dry-run needs it (%w)", err)
		case status.Code(err) == codes.Unimplemented:
			fmt.Fprintf(d.a.errOut, "warning: this node's schedd does not check a deploy ahead: a service that fails leaves what was made before it\n")
			return nil, nil
		case err == nil:
			out = append(out, svc)
		default:
			problems = append(problems, fmt.Sprintf("service %s: %s", spec.Name, describe(err)))
			if code == codes.OK {
				code = status.Code(err) // the exit status the first failure's deploy would give
			}
		}
	}
	if len(problems) > 0 {
		return nil, status.Error(code, "nothing was changed:\n"+strings.Join(problems, "\n"))
	}
	return out, nil
}

// printPlan says what the deploy would do: what it would create, the
// services it would create, update or leave, and those of the stack the
// files no longer name.
func (d *stackDeployer) printPlan(newSecrets, newConfigs []string, newVolumes []stack.Volume, checked []*schedv1.Service, prune bool) error {
	ctx, cancel := d.a.ctx(d.cmd)
	defer cancel()
	before, err := servicesOfStack(ctx, d.schedd, d.plan.Stack)
	if err != nil {
		return err
	}
	for _, name := range newSecrets {
		fmt.Fprintf(d.a.out, "secret %s would be created\n", name)
	}
	for _, name := range newConfigs {
		fmt.Fprintf(d.a.out, "config %s would be created\n", name)
	}
	for _, v := range newVolumes {
		fmt.Fprintf(d.a.out, "volume %s would be created\n", v.Name)
	}
	want := map[string]bool{}
	for _, s := range checked {
		want[s.GetName()] = true
		prev, existed := before[s.GetName()]
		switch {
		case !existed:
			fmt.Fprintf(d.a.out, "service %s would be created\n", s.GetName())
		case prev.GetVersion() == s.GetVersion():
			fmt.Fprintf(d.a.out, "service %s unchanged\n", s.GetName())
		default:
			fmt.Fprintf(d.a.out, "service %s would be updated (version %d)\n", s.GetName(), s.GetVersion())
		}
	}
	for _, name := range slices.Sorted(maps.Keys(before)) {
		switch {
		case want[name]:
		case prune:
			fmt.Fprintf(d.a.out, "service %s would be removed\n", name)
		default:
			fmt.Fprintf(d.a.out, "service %s is not in the files: kept (--prune removes it)\n", name)
		}
	}
	return nil
}

// services deploys the plan's services and returns those it created or
// changed; with prune it removes the stack's services the plan lacks.
func (d *stackDeployer) services(prune bool) ([]*schedv1.Service, error) {
	ctx, cancel := d.a.ctx(d.cmd)
	defer cancel()
	before, err := servicesOfStack(ctx, d.schedd, d.plan.Stack)
	if err != nil {
		return nil, err
	}
	var changed []*schedv1.Service
	want := map[string]bool{}
	for _, spec := range d.plan.Services {
		want[spec.Name] = true
		data, err := checkSpec(spec)
		if err != nil {
			return changed, err
		}
		s, err := d.schedd.DeployService(ctx, &schedv1.UpdateServiceRequest{Spec: data})
		if err != nil {
			return changed, fmt.Errorf("service %s: %w", spec.Name, err)
		}
		prev, existed := before[spec.Name]
		switch {
		case !existed:
			fmt.Fprintf(d.a.errOut, "service %s created\n", s.GetName())
		case prev.GetVersion() == s.GetVersion():
			fmt.Fprintf(d.a.errOut, "service %s unchanged\n", s.GetName())
			continue
		default:
			fmt.Fprintf(d.a.errOut, "service %s updated (version %d)\n", s.GetName(), s.GetVersion())
		}
		changed = append(changed, s)
	}
	for _, name := range slices.Sorted(maps.Keys(before)) {
		if want[name] {
			continue
		}
		if !prune {
			fmt.Fprintf(d.a.errOut, "service %s is not in the files: kept (--prune removes it)\n", name)
			continue
		}
		if _, err := d.schedd.RemoveService(ctx, &schedv1.GetServiceRequest{Name: name}); err != nil {
			return changed, fmt.Errorf("service %s: %w", name, err)
		}
		fmt.Fprintf(d.a.errOut, "service %s removed\n", name)
	}
	return changed, nil
}

// servicesOfStack are the services of stack name, by service name.
func servicesOfStack(ctx context.Context, c *client.Schedd, name string) (map[string]*schedv1.Service, error) {
	resp, err := c.ListServices(ctx, &schedv1.ListServicesRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]*schedv1.Service{}
	for _, s := range resp.GetServices() {
		if specOf(s).Stack == name {
			out[s.GetName()] = s
		}
	}
	return out, nil
}

func specOf(s *schedv1.Service) sched.ServiceSpec {
	var spec sched.ServiceSpec
	json.Unmarshal(s.GetSpec(), &spec) // schedd wrote it
	return spec
}

type stackView struct {
	Name     string `json:"name"`
	Services int    `json:"services"`
}

func (a *app) stackLs() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List stacks",
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
			resp, err := c.ListServices(ctx, &schedv1.ListServicesRequest{})
			if err != nil {
				return err
			}
			count := map[string]int{}
			for _, s := range resp.GetServices() {
				if st := specOf(s).Stack; st != "" {
					count[st]++
				}
			}
			views := []stackView{}
			for _, name := range slices.Sorted(maps.Keys(count)) {
				views = append(views, stackView{Name: name, Services: count[name]})
			}
			return render(a.out, format, views, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NAME\tSERVICES")
				for _, v := range views {
					fmt.Fprintf(tw, "%s\t%d\n", v.Name, v.Services)
				}
			})
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "Name")
	return cmd
}

// stackOf returns the services of stack name, sorted, failing with "not
// found" for a stack without services.
func (a *app) stackOf(ctx context.Context, c *client.Schedd, name string) ([]*schedv1.Service, error) {
	byName, err := servicesOfStack(ctx, c, name)
	if err != nil {
		return nil, err
	}
	if len(byName) == 0 {
		return nil, notFoundError{fmt.Errorf("stack %s has no services (`shoalctl stack ls` lists the stacks)", name)}
	}
	var out []*schedv1.Service
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[n])
	}
	return out, nil
}

func (a *app) stackServices() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "services NAME",
		Short: "List a stack's services",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			services, err := a.stackOf(ctx, c, args[0])
			if err != nil {
				return err
			}
			views := []serviceView{}
			for _, s := range services {
				views = append(views, serviceViewOf(s))
			}
			return renderServices(a, format, views)
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "Name")
	return cmd
}

func (a *app) stackPs() *cobra.Command {
	var format string
	var all bool
	cmd := &cobra.Command{
		Use:   "ps NAME",
		Short: "List the tasks of a stack's services",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			services, err := a.stackOf(ctx, c, args[0])
			if err != nil {
				return err
			}
			var tasks []*schedv1.Task
			for _, s := range services {
				resp, err := c.ListTasks(ctx, &schedv1.ListTasksRequest{Service: s.GetName(), All: all})
				if err != nil {
					return err
				}
				tasks = append(tasks, resp.GetTasks()...)
			}
			return renderTasks(a, format, tasks)
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "ID")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include finished tasks")
	return cmd
}

func (a *app) stackRm() *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove stacks: their services, and the secrets and configs they created",
		Long: `Removes every service of each stack and, once their tasks have stopped,
the secrets and configs the stack created. Volumes are kept, with their data (remove
them with shoalctl volume rm), as Docker keeps a stack's volumes.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			st, err := a.statd()
			if err != nil {
				return err
			}
			defer st.Close()
			return a.eachName(args, func(name string) error {
				services, err := a.stackOf(ctx, c, name)
				var missing notFoundError
				if errors.As(err, &missing) {
					// A deploy that stopped before its first
					// service left the secrets and configs it
					// had made: they are the stack's all the same.
					n, rmErr := a.removeStackSecrets(ctx, st, c, name)
					if rmErr != nil || n > 0 {
						return rmErr
					}
				}
				if err != nil {
					return err
				}
				var names []string
				for _, s := range services {
					if _, err := c.RemoveService(ctx, &schedv1.GetServiceRequest{Name: s.GetName()}); err != nil {
						return fmt.Errorf("service %s: %w", s.GetName(), err)
					}
					fmt.Fprintf(a.errOut, "service %s removed\n", s.GetName())
					names = append(names, s.GetName())
				}
				if w.detach {
					return nil
				}
				if err := a.waitGone(cmd, c, names, w); err != nil {
					return err
				}
				_, err = a.removeStackSecrets(ctx, st, c, name)
				return err
			})
		},
	}
	w.bind(cmd.Flags())
	cmd.Flags().Lookup("detach").Usage = "return once the services are removed, without waiting for their tasks or removing the stack's secrets and configs"
	return cmd
}

// removeStackSecrets removes the secrets and configs stack name created
// and says how many it removed.
func (a *app) removeStackSecrets(ctx context.Context, st *client.Statd, c *client.Schedd, name string) (int, error) {
	var failed []string
	removed := 0
	for _, o := range []fileObject{secretObject, configObject} {
		resp, err := st.Secrets.ListSecrets(ctx, &clusterv1.ListSecretsRequest{Configs: o.config})
		if err != nil {
			return removed, err
		}
		for _, s := range resp.GetSecrets() {
			if s.GetLabels()[stack.LabelStack] != name {
				continue
			}
			if _, err := c.RemoveSecret(ctx, &schedv1.RemoveSecretRequest{Name: s.GetName(), Config: o.config}); err != nil {
				failed = append(failed, fmt.Sprintf("%s %s (%s)", o.noun, s.GetName(), describe(err)))
				continue
			}
			fmt.Fprintf(a.errOut, "%s %s removed\n", o.noun, s.GetName())
			removed++
		}
	}
	if len(failed) > 0 {
		return removed, fmt.Errorf("stack %s: kept %s", name, strings.Join(failed, "; "))
	}
	return removed, nil
}
