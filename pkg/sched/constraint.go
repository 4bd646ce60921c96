package sched

import (
	"fmt"
	"strings"
)

// Constraint is one parsed placement constraint: an attribute of the node,
// an operator and a value, e.g. node.labels.zone==eu.
type Constraint struct {
	// Expr is the expression as written (used in messages).
	Expr string
	// Attr is "id", "name", "hostname" or "labels.<key>".
	Attr  string
	Equal bool // == (true) or != (false)
	Value string
}

// ParseConstraint parses "node.<attr>==value" or "node.<attr>!=value" where
// attr is id, name, hostname or labels.<key>. Spaces around the operator
// are allowed; the value may be quoted.
func ParseConstraint(expr string) (Constraint, error) {
	c := Constraint{Expr: expr}
	fail := func(why string) (Constraint, error) {
		return Constraint{}, fmt.Errorf("constraint %q: %s (want node.labels.KEY==VALUE, node.hostname!=VALUE, node.id, node.name)", expr, why)
	}
	var lhs, rhs string
	if l, r, ok := strings.Cut(expr, "=="); ok {
		lhs, rhs, c.Equal = l, r, true
	} else if l, r, ok := strings.Cut(expr, "!="); ok {
		lhs, rhs = l, r
	} else {
		return fail("no == or != operator")
	}
	lhs, rhs = strings.TrimSpace(lhs), strings.TrimSpace(rhs)
	if strings.Contains(rhs, "==") || strings.Contains(rhs, "!=") {
		return fail("more than one operator")
	}
	if len(rhs) >= 2 && (rhs[0] == '"' || rhs[0] == '\'') && rhs[len(rhs)-1] == rhs[0] {
		rhs = rhs[1 : len(rhs)-1]
	}
	if rhs == "" {
		return fail("empty value")
	}
	attr, ok := strings.CutPrefix(lhs, "node.")
	if !ok {
		return fail(fmt.Sprintf("unknown attribute %q", lhs))
	}
	switch {
	case attr == "id", attr == "name", attr == "hostname":
	case strings.HasPrefix(attr, "labels."):
		key := strings.TrimPrefix(attr, "labels.")
		if key == "" || strings.ContainsAny(key, " \t") {
			return fail("empty or malformed label key")
		}
	default:
		return fail(fmt.Sprintf("unknown attribute %q", lhs))
	}
	c.Attr, c.Value = attr, rhs
	return c, nil
}

// ParseConstraints parses every expression, failing on the first bad one.
func ParseConstraints(exprs []string) ([]Constraint, error) {
	out := make([]Constraint, 0, len(exprs))
	for _, e := range exprs {
		c, err := ParseConstraint(e)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Match reports whether n satisfies c. A missing label never equals a
// value and always differs from one.
func (c Constraint) Match(n Node) bool {
	var v string
	var present bool
	switch c.Attr {
	case "id":
		v, present = n.ID, true
	case "name":
		v, present = n.Name, true
	case "hostname":
		v, present = n.Hostname, true
	default:
		v, present = n.Labels[strings.TrimPrefix(c.Attr, "labels.")]
	}
	if c.Equal {
		return present && v == c.Value
	}
	return !present || v != c.Value
}

func (c Constraint) String() string { return c.Expr }
