package sched

import (
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"text/template"
)

// TemplateContext is what a service's templates may name, as Swarm's
// service templates (`--hostname "{{.Node.Hostname}}-{{.Task.Slot}}"`):
// a task's hostname and the values of its environment are expanded on
// the node that starts it.
type TemplateContext struct {
	Service struct {
		ID, Name string
		Labels   map[string]string
	}
	Node struct {
		ID, Hostname string
		Platform     struct{ Architecture, OS string }
	}
	Task struct{ ID, Name, Slot string }
}

// NewTemplateContext is the context of task t of spec on node.
func NewTemplateContext(spec ServiceSpec, t Task, node Node) TemplateContext {
	var c TemplateContext
	c.Service.ID, c.Service.Name, c.Service.Labels = spec.Name, spec.Name, spec.Labels
	c.Node.ID, c.Node.Hostname = node.ID, node.Hostname
	if c.Node.Hostname == "" {
		c.Node.Hostname = node.Name
	}
	c.Node.Platform.OS, c.Node.Platform.Architecture = "linux", runtime.GOARCH
	c.Task.ID, c.Task.Name, c.Task.Slot = t.ID, t.Service+"."+t.Slot+"."+t.ID, t.Slot
	return c
}

// sampleContext checks templates at a spec's validation, with values of
// the shape a node gives.
func sampleContext(spec ServiceSpec) TemplateContext {
	return NewTemplateContext(spec, Task{ID: "0123456789ab", Service: spec.Name, Slot: "0"}, Node{ID: "0123456789abcdef", Hostname: "node-1"})
}

// expand runs s as a template of c. A string without "{{" is returned
// as it is.
func expand(s string, c TemplateContext) (string, error) {
	if !strings.Contains(s, "{{") {
		return s, nil
	}
	t, err := template.New("").Option("missingkey=error").Parse(s)
	if err != nil {
		return "", fmt.Errorf("template %q: %w", s, err)
	}
	var b strings.Builder
	if err := t.Execute(&b, c); err != nil {
		return "", fmt.Errorf("template %q: %w", s, err)
	}
	return b.String(), nil
}

// hostnameRE is a hostname: dot-separated DNS labels.
var hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$`)

// TaskHostname is the hostname of a task of spec in context c: spec's
// Hostname expanded, or "" for the node's default (service-slot).
func (s ServiceSpec) TaskHostname(c TemplateContext) (string, error) {
	if s.Hostname == "" {
		return "", nil
	}
	h, err := expand(s.Hostname, c)
	if err != nil {
		return "", fmt.Errorf("hostname: %w", err)
	}
	if len(h) > 253 || !hostnameRE.MatchString(h) {
		return "", fmt.Errorf("hostname %q (from %q) is not a hostname: DNS labels of letters, digits and '-', separated by dots", h, s.Hostname)
	}
	return h, nil
}

// TaskEnv is the environment of a task of spec in context c: each
// value expanded as a template.
func (s ServiceSpec) TaskEnv(c TemplateContext) ([]string, error) {
	if !strings.Contains(strings.Join(s.Env, "\n"), "{{") {
		return s.Env, nil
	}
	out := make([]string, 0, len(s.Env))
	for _, kv := range s.Env {
		k, v, _ := strings.Cut(kv, "=")
		x, err := expand(v, c)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", k, err)
		}
		out = append(out, k+"="+x)
	}
	return out, nil
}
