package ctl

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/statepb"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func (a *app) stateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Read and write raw cluster state documents (admin and debugging)",
		Long: `Documents are addressed by keys like /demo/web and hold typed fields.
Fields are written as name=value (a string) or name:type=value with type
one of string, int, float, bool, bytes (base64).`,
	}
	cmd.AddCommand(a.statePut(), a.stateGet(), a.stateRm(), a.stateLs(), a.stateWatch())
	return cmd
}

// parseFields parses name[:type]=value arguments.
func parseFields(args []string) (map[string]*statev1.Value, error) {
	out := make(map[string]*statev1.Value, len(args))
	for _, arg := range args {
		lhs, text, ok := strings.Cut(arg, "=")
		if !ok {
			return nil, usageError{fmt.Errorf("field %q: want name=value or name:type=value", arg)}
		}
		name, typ, typed := strings.Cut(lhs, ":")
		kind := crdt.KindString
		if typed {
			k, err := crdt.ParseKind(typ)
			if err != nil {
				return nil, usageError{fmt.Errorf("field %q: %w", name, err)}
			}
			kind = k
		}
		v, err := crdt.ParseValue(kind, text)
		if err != nil {
			return nil, usageError{fmt.Errorf("field %q: %w", name, err)}
		}
		if _, dup := out[name]; dup {
			return nil, usageError{fmt.Errorf("field %q given twice", name)}
		}
		out[name] = statepb.ToValue(v)
	}
	return out, nil
}

func (a *app) statePut() *cobra.Command {
	var fromFiles []string
	cmd := &cobra.Command{
		Use:   "put KEY FIELD=VALUE...",
		Short: "Set fields of a document (other fields are kept)",
		Example: `  shoalctl state put /demo/web image=busybox replicas:int=3
  shoalctl state put /demo/web --from-file config=./web.conf`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && len(fromFiles) == 0 {
				return usageError{fmt.Errorf("no fields given: want FIELD=VALUE arguments or --from-file")}
			}
			fields, err := parseFields(args[1:])
			if err != nil {
				return err
			}
			for _, ff := range fromFiles {
				name, path, ok := strings.Cut(ff, "=")
				if !ok {
					return usageError{fmt.Errorf("--from-file %q: want FIELD=PATH", ff)}
				}
				if _, dup := fields[name]; dup {
					return usageError{fmt.Errorf("field %q given twice", name)}
				}
				data, err := os.ReadFile(path)
				if err != nil {
					return usageError{fmt.Errorf("--from-file %s: %w", name, err)}
				}
				fields[name] = statepb.ToValue(crdt.Bytes(data))
			}
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Put(ctx, &statev1.PutRequest{Key: args[0], Fields: fields})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%s updated at revision %d\n", args[0], resp.GetRevision())
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&fromFiles, "from-file", nil, "set FIELD=PATH: a bytes field with the file's content (repeatable)")
	return cmd
}

func (a *app) stateGet() *cobra.Command {
	var format string
	var meta bool
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Show a document",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Get(ctx, &statev1.GetRequest{Key: args[0], WithMeta: meta})
			if err != nil {
				return err
			}
			doc := viewOf(resp.GetDocument())
			return render(a.out, format, doc, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "KEY\t%s\nREVISION\t%d\nUPDATED\t%s\n\n", doc.Key, doc.Revision, doc.Updated)
				fmt.Fprintln(tw, "FIELD\tTYPE\tVALUE")
				for _, name := range slices.Sorted(maps.Keys(doc.fields)) {
					v := doc.fields[name]
					fmt.Fprintf(tw, "%s\t%s\t%s\n", name, v.Kind, v.Text())
				}
				if meta {
					fmt.Fprintln(tw, "\nFIELD\tSTAMP\tDELETED")
					for _, name := range slices.Sorted(maps.Keys(doc.Meta)) {
						m := doc.Meta[name]
						fmt.Fprintf(tw, "%s\t%s\t%v\n", name, m.Stamp, m.Deleted)
					}
				}
			})
		},
	}
	outputFlag(cmd, &format)
	cmd.Flags().BoolVar(&meta, "meta", false, "show the stamp of every field, tombstones included")
	return cmd
}

func (a *app) stateRm() *cobra.Command {
	return &cobra.Command{
		Use:   "rm KEY [FIELD...]",
		Short: "Delete a document, or only some of its fields",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.Delete(ctx, &statev1.DeleteRequest{Key: args[0], Fields: args[1:]})
			if err != nil {
				return err
			}
			if !resp.GetExisted() {
				fmt.Fprintf(a.out, "%s: nothing to delete\n", args[0])
				return nil
			}
			fmt.Fprintf(a.out, "%s deleted at revision %d\n", args[0], resp.GetRevision())
			return nil
		},
	}
}

func (a *app) stateLs() *cobra.Command {
	var format string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls [PREFIX]",
		Short: "List documents under a key prefix",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			c, ctx, done, err := a.statdCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			docs := []docView{}
			if err := listAll(ctx, c, prefix, false, func(d *statev1.Document) bool {
				docs = append(docs, viewOf(d))
				return limit <= 0 || len(docs) < limit
			}); err != nil {
				return err
			}
			return render(a.out, format, docs, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "KEY\tREVISION\tFIELDS")
				for _, d := range docs {
					fmt.Fprintf(tw, "%s\t%d\t%s\n", d.Key, d.Revision, d.summary())
				}
			})
		},
	}
	outputFlag(cmd, &format)
	cmd.Flags().IntVar(&limit, "limit", 0, "show at most this many documents (0: all)")
	return cmd
}

func (a *app) stateWatch() *cobra.Command {
	var format string
	var after uint64
	cmd := &cobra.Command{
		Use:   "watch [PREFIX]",
		Short: "Follow changes under a key prefix (resumes across statd restarts)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			if strings.HasPrefix(format, templatePrefix) {
				return usageError{errors.New("state watch prints table, json or yaml")}
			}
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			c, err := a.statd()
			if err != nil {
				return err
			}
			defer c.Close()
			if !cmd.Flags().Changed("after") {
				after = client.FromNow
			}
			enc := json.NewEncoder(a.out)
			header := false
			return c.Watch(cmd.Context(), prefix, after, func(resp *statev1.WatchResponse) error {
				for _, e := range resp.GetEvents() {
					v := eventView{Type: eventType(e.GetType()), Revision: e.GetRevision(), Document: viewOf(e.GetDocument())}
					switch format {
					case "json":
						if err := enc.Encode(v); err != nil {
							return err
						}
						continue
					case "yaml":
						// A stream of YAML documents, one per event.
						if _, err := io.WriteString(a.out, "---\n"); err != nil {
							return err
						}
						if err := render(a.out, format, v, nil); err != nil {
							return err
						}
						continue
					}
					if !header {
						fmt.Fprintf(a.out, "%-8s %-8s %s\n", "REV", "TYPE", "KEY FIELDS")
						header = true
					}
					fmt.Fprintf(a.out, "%-8d %-8s %s %s\n", v.Revision, v.Type, v.Document.Key, v.Document.summary())
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table, json (one event per line) or yaml (one document per event)")
	cmd.Flags().Uint64Var(&after, "after", 0, "replay the changes after this revision first (default: only new changes)")
	return cmd
}

func eventType(t statev1.Event_Type) string {
	switch t {
	case statev1.Event_TYPE_PUT:
		return "PUT"
	case statev1.Event_TYPE_DELETE:
		return "DELETE"
	}
	return "UNKNOWN"
}

// docView is how documents look in JSON and YAML output: fields as native
// values, stamps as text.
type docView struct {
	Key      string              `json:"key"`
	Revision uint64              `json:"revision"`
	Updated  string              `json:"updated,omitempty"`
	Deleted  string              `json:"deleted,omitempty"`
	Fields   map[string]any      `json:"fields"`
	Meta     map[string]metaView `json:"meta,omitempty"`
	fields   map[string]crdt.Value
}

type metaView struct {
	Stamp   string `json:"stamp"`
	Deleted bool   `json:"deleted,omitempty"`
}

type eventView struct {
	Type     string  `json:"type"`
	Revision uint64  `json:"revision"`
	Document docView `json:"document"`
}

func viewOf(d *statev1.Document) docView {
	v := docView{
		Key:      d.GetKey(),
		Revision: d.GetRevision(),
		Updated:  stampText(d.GetUpdated()),
		Deleted:  stampText(d.GetDeleted()),
		Fields:   map[string]any{},
		fields:   map[string]crdt.Value{},
	}
	for name, pv := range d.GetFields() {
		cv, err := statepb.FromValue(pv)
		if err != nil {
			continue
		}
		v.fields[name] = cv
		v.Fields[name] = native(cv)
	}
	if len(d.GetMeta()) > 0 {
		v.Meta = map[string]metaView{}
		for name, m := range d.GetMeta() {
			v.Meta[name] = metaView{Stamp: stampText(m.GetStamp()), Deleted: m.GetDeleted()}
		}
	}
	return v
}

func native(v crdt.Value) any {
	switch v.Kind {
	case crdt.KindInt:
		i, _ := v.AsInt()
		return i
	case crdt.KindFloat:
		f, _ := v.AsFloat()
		return f
	case crdt.KindBool:
		b, _ := v.AsBool()
		return b
	case crdt.KindBytes:
		return base64.StdEncoding.EncodeToString(v.Data)
	}
	return v.Text()
}

func stampText(s *statev1.Stamp) string {
	if s == nil {
		return ""
	}
	return statepb.FromStamp(s).TS.Time().UTC().Format("2006-01-02T15:04:05.000000000Z") + fmt.Sprintf("+%d@%s", s.GetLogical(), s.GetNode())
}

// summary renders the fields on one line: a=1 b=x.
func (d docView) summary() string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(d.fields)) {
		parts = append(parts, name+"="+d.fields[name].Text())
	}
	return strings.Join(parts, " ")
}

// listAll calls fn with the documents under prefix, page by page, until
// fn returns false or none are left.
func listAll(ctx context.Context, c *client.Statd, prefix string, withMeta bool, fn func(*statev1.Document) bool) error {
	token := ""
	for {
		resp, err := c.List(ctx, &statev1.ListRequest{Prefix: prefix, PageToken: token, PageSize: 500, WithMeta: withMeta})
		if err != nil {
			return err
		}
		for _, d := range resp.GetDocuments() {
			if !fn(d) {
				return nil
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			return nil
		}
	}
}
