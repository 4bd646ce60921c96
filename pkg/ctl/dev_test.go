package ctl

import (
	"errors"
	"slices"
	"testing"
)

func TestParseGroup(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"1", []int{1}},
		{"1,2,5", []int{1, 2, 5}},
		{"3-5", []int{3, 4, 5}},
		{"1,3-4", []int{1, 3, 4}},
		{"2-2", []int{2}},
		{"10-12,1", []int{10, 11, 12, 1}},
	} {
		got, err := parseGroup(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseGroup(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "0", "-1", "a", "1,", ",1", "1-", "-3", "5-3", "1-x", "1,,2", "1.5", "2-3-4"} {
		got, err := parseGroup(in)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("parseGroup(%q) = %v, %v; want a usage error", in, got, err)
		}
	}
}
