package daemon

import "testing"

func TestSize(t *testing.T) {
	for in, want := range map[string]Size{"10MiB": 10 << 20, "10m": 10 << 20, "512k": 512 << 10, "1048577": 1<<20 + 1, "1g": 1 << 30} {
		var s Size
		if err := s.Set(in); err != nil || s != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, s, err, want)
		}
		var back Size
		if err := back.UnmarshalText([]byte(s.String())); err != nil || back != s {
			t.Errorf("%d printed as %q reads back as %d, %v", s, s.String(), back, err)
		}
	}
	for _, bad := range []string{"", "ten", "-1", "5x"} {
		var s Size
		if s.Set(bad) == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}
