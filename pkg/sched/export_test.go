package sched

// BaselineSpecFields and SpecSchemaHas open the spec field tables to the
// tests of package sched_test.
func BaselineSpecFields() map[string]bool { return baselineSpecFields }

func SpecSchemaHas(path string) bool {
	_, ok := specSchema[path]
	return ok
}
