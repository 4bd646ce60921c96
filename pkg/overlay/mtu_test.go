package overlay

import "testing"

func TestMTU(t *testing.T) {
	for _, c := range []struct{ underlay, want int }{
		{1500, 1420},
		{9001, 8921},
		{1400, 1320},
		{1360, 1280},
		{1350, 1280},
		{576, 1280},
		{0, 1420},
		{-1, 1420},
	} {
		if got := MTU(c.underlay); got != c.want {
			t.Errorf("MTU(%d) = %d, want %d", c.underlay, got, c.want)
		}
	}
}
