package schedd

import "github.com/shoal-dev/shoal/pkg/crdt"

// crdtValue is a field value written to statd.
type crdtValue = crdt.Value

func intValue(i int64) crdt.Value { return crdt.Int(i) }

func stringValue(s string) crdt.Value { return crdt.String(s) }
