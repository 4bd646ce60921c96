package ctl

import (
	"fmt"
	"strconv"
	"strings"
)

// parseBytes parses a memory size: a plain number of bytes, or a number
// with a unit: k/ki/kib, m/mi/mib, g/gi/gib (all binary, as Docker and
// Nomad read them), e.g. 512m, 1.5GiB.
func parseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffixes []string
		mult     int64
	}{
		{[]string{"kib", "ki", "kb", "k"}, 1 << 10},
		{[]string{"mib", "mi", "mb", "m"}, 1 << 20},
		{[]string{"gib", "gi", "gb", "g"}, 1 << 30},
		{[]string{"tib", "ti", "tb", "t"}, 1 << 40},
		{[]string{"b"}, 1},
	} {
		found := false
		for _, suf := range u.suffixes {
			if strings.HasSuffix(t, suf) {
				t, mult, found = strings.TrimSuffix(t, suf), u.mult, true
				break
			}
		}
		if found {
			break
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("memory %q: want a size like 256m, 1.5GiB or 1048576", s)
	}
	return int64(f * float64(mult)), nil
}

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
