package ctl

import (
	"fmt"
	"strconv"
	"strings"
)

// parseCPU parses CPUs as a decimal count (0.5, 2) or millicores (500m).
func parseCPU(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if m, ok := strings.CutSuffix(t, "m"); ok {
		v, err := strconv.ParseInt(m, 10, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("cpu %q: want CPUs like 0.5 or millicores like 500m", s)
		}
		return v, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("cpu %q: want CPUs like 0.5 or millicores like 500m", s)
	}
	return int64(f*1000 + 0.5), nil
}
