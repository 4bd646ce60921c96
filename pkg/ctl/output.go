package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"text/tabwriter"
	"text/template"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// outputFlag adds -o/--output to a read command, and docker's --format.
func outputFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVarP(format, "output", "o", "table", "output format: table, json, yaml or template=GO-TEMPLATE (each item, e.g. template='{{.Name}}')")
	cmd.Flags().Var(dockerFormat{format}, "format", "print each item with a Go template, as docker's --format ('{{.Name}}'; json: as -o json)")
}

// quietFlag adds docker's -q/--quiet to a list command: only each item's
// field (its ID or name), a line each.
func quietFlag(cmd *cobra.Command, format *string, field string) {
	what := strings.ToLower(field) + "s"
	if field == "ID" {
		what = "IDs"
	}
	f := cmd.Flags().VarPF(quietValue{format, field}, "quiet", "q", "print only the "+what)
	f.NoOptDefVal = "true"
}

type quietValue struct {
	format *string
	field  string
}

func (q quietValue) String() string { return "false" }
func (q quietValue) Type() string   { return "bool" }

func (q quietValue) Set(v string) error {
	on, err := strconv.ParseBool(v)
	if on {
		*q.format = templatePrefix + "{{." + q.field + "}}"
	}
	return err
}

// templatePrefix starts an -o that is a Go template.
const templatePrefix = "template="

func checkFormat(format string) error {
	switch format {
	case "table", "json", "yaml":
		return nil
	}
	if text, ok := strings.CutPrefix(format, templatePrefix); ok {
		if _, err := parseItemTemplate(text); err != nil {
			return usageError{err}
		}
		return nil
	}
	return usageError{fmt.Errorf("unknown output format %q: want table, json, yaml or template=GO-TEMPLATE", format)}
}

// checkStreamFormat is checkFormat for the commands that print as things
// happen (events, stats): a table, JSON Lines or a template; no YAML.
func checkStreamFormat(format string) error {
	if err := checkFormat(format); err != nil || format == "yaml" {
		return usageError{fmt.Errorf("unknown output format %q: want table, json (one a line) or template=GO-TEMPLATE", format)}
	}
	return nil
}

// dockerFormat is --format: a template, or json.
type dockerFormat struct{ format *string }

func (d dockerFormat) String() string {
	if d.format == nil {
		return ""
	}
	if t, ok := strings.CutPrefix(*d.format, templatePrefix); ok {
		return t
	}
	return ""
}

func (d dockerFormat) Set(v string) error {
	if v == "json" {
		*d.format = "json"
	} else {
		*d.format = templatePrefix + v
	}
	return nil
}

func (d dockerFormat) Type() string { return "template" }

// parseItemTemplate parses an output template; json, join, upper and
// lower are there as in docker's.
func parseItemTemplate(text string) (*template.Template, error) {
	t, err := template.New("output").Option("missingkey=error").Funcs(template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"join":  strings.Join,
		"upper": strings.ToUpper,
		"lower": strings.ToLower,
	}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("output template: %w", err)
	}
	return t, nil
}

// renderTemplate prints each item of v (v itself if it is no list) with
// the template, a line each.
func renderTemplate(w io.Writer, text string, v any) error {
	t, err := parseItemTemplate(text)
	if err != nil {
		return err
	}
	items := []any{v}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice {
		items = make([]any, rv.Len())
		for i := range items {
			items[i] = rv.Index(i).Interface()
		}
	}
	for _, it := range items {
		var b strings.Builder
		if err := t.Execute(&b, it); err != nil {
			return fmt.Errorf("output template: %w", err)
		}
		if _, err := fmt.Fprintln(w, b.String()); err != nil {
			return err
		}
	}
	return nil
}

// render writes v as JSON or YAML, or calls table for the table format.
func render(w io.Writer, format string, v any, table func(*tabwriter.Writer)) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	case "table":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	}
	if text, ok := strings.CutPrefix(format, templatePrefix); ok {
		return renderTemplate(w, text, v)
	}
	return checkFormat(format)
}
