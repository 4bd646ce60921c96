package sched

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// Spec fields and schedd versions. A schedd decodes a spec with the
// fields it knows and drops the others without a word: during a rolling
// upgrade an older schedd would run a task without, say, its pids limit.
// So a schedd publishes in its node document the spec fields it knows
// beyond those every schedd from before this check knew (the baseline),
// an owner places a task only on nodes that know every field its spec
// uses, and a node refuses a reservation whose spec holds fields it does
// not know. Paths name nested fields with dots ("healthcheck.interval");
// elements of lists share their list's path; maps are leaves.

// NodeSpecFieldsField is the node document field (a comma-separated list)
// of the spec fields its schedd knows beyond the baseline. A node without
// it runs a schedd from before the check, which knows the baseline only.
const NodeSpecFieldsField = "spec_fields"

// specSchema maps each path of ServiceSpec to its Go type.
var specSchema = func() map[string]reflect.Type {
	out := map[string]reflect.Type{}
	walkSchema(reflect.TypeFor[ServiceSpec](), "", out)
	return out
}()

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// structOf returns the struct type t holds (through pointers and lists)
// whose fields JSON decodes one by one, or nil.
func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || reflect.PointerTo(t).Implements(jsonUnmarshaler) || t.PkgPath() != reflect.TypeFor[ServiceSpec]().PkgPath() {
		return nil // time.Time, Duration, a map's values: leaves
	}
	return t
}

// jsonName is the name field f has in JSON ("" if it has none).
func jsonName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return f.Name
	}
	return name
}

func walkSchema(t reflect.Type, prefix string, out map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Tag.Get("json") == "" {
			if st := structOf(f.Type); st != nil {
				walkSchema(st, prefix, out)
				continue
			}
		}
		name := jsonName(f)
		if name == "" {
			continue
		}
		out[prefix+name] = f.Type
		if st := structOf(f.Type); st != nil {
			walkSchema(st, prefix+name+".", out)
		}
	}
}

// SpecFieldsBeyondBaseline lists, sorted, the spec fields this schedd
// knows that schedds from before the check did not: what it publishes in
// NodeSpecFieldsField.
func SpecFieldsBeyondBaseline() []string {
	var out []string
	for _, p := range slices.Sorted(maps.Keys(specSchema)) {
		if !baselineSpecFields[p] {
			out = append(out, p)
		}
	}
	return out
}

// ParseNodeSpecFields reads NodeSpecFieldsField's value.
func ParseNodeSpecFields(v string) map[string]bool {
	out := map[string]bool{}
	for _, p := range strings.Split(v, ",") {
		if p != "" {
			out[p] = true
		}
	}
	return out
}

// SpecNeeds lists, sorted, the fields of spec beyond the baseline that it
// sets (not zero): a node must know each to run it as written.
func SpecNeeds(spec ServiceSpec) []string {
	set := map[string]bool{}
	walkSet(reflect.ValueOf(spec), "", set)
	maps.DeleteFunc(set, func(p string, _ bool) bool { return baselineSpecFields[p] })
	return slices.Sorted(maps.Keys(set))
}

func walkSet(v reflect.Value, prefix string, set map[string]bool) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		fv := v.Field(i)
		if f.Anonymous && f.Tag.Get("json") == "" && structOf(f.Type) != nil {
			if fv.Kind() == reflect.Struct {
				walkSet(fv, prefix, set)
			}
			continue
		}
		name := jsonName(f)
		if name == "" || fv.IsZero() {
			continue
		}
		path := prefix + name
		set[path] = true
		if structOf(f.Type) == nil {
			continue
		}
		for fv.Kind() == reflect.Pointer {
			fv = fv.Elem()
		}
		switch fv.Kind() {
		case reflect.Struct:
			walkSet(fv, path+".", set)
		case reflect.Slice, reflect.Array:
			for j := range fv.Len() {
				e := fv.Index(j)
				for e.Kind() == reflect.Pointer && !e.IsNil() {
					e = e.Elem()
				}
				if e.Kind() == reflect.Struct {
					walkSet(e, path+".", set)
				}
			}
		}
	}
}

// UnknownSpecFields lists, sorted, the fields of a spec's JSON that this
// schedd's ServiceSpec does not have: a newer writer's, which decoding
// would drop. Nil when raw is not a JSON object.
func UnknownSpecFields(raw []byte) []string {
	set := map[string]bool{}
	walkJSON(raw, "", set)
	return slices.Sorted(maps.Keys(set))
}

func walkJSON(raw []byte, prefix string, unknown map[string]bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) == nil {
			for _, e := range list {
				walkJSON(e, prefix, unknown)
			}
		}
		return
	}
	for key, val := range obj {
		path := prefix + key
		ft, ok := specSchema[path]
		if !ok {
			// encoding/json matches names without regard to case.
			for p, pt := range specSchema {
				if strings.EqualFold(p, path) {
					path, ft, ok = p, pt, true
					break
				}
			}
		}
		if !ok {
			unknown[path] = true
			continue
		}
		if structOf(ft) != nil {
			walkJSON(val, path+".", unknown)
		}
	}
}

// specFieldsReject is the Reject of a node whose schedd knows the
// baseline and known, for a request that needs needs (nil: it fits).
func specFieldsReject(needs []string, known map[string]bool) (Reject, bool) {
	var missing []string
	for _, p := range needs {
		if !known[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return Reject{}, false
	}
	return Reject{Class: RejectSchedd, Detail: strings.Join(missing, ",")}, true
}
