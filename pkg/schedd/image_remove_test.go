package schedd

import (
	"testing"

	"github.com/opencontainers/go-digest"
)

func TestNamesImage(t *testing.T) {
	dg := digest.FromString("image")
	names := []string{"local/busybox:latest", "registry.example:5000/team/app:1"}
	for _, tc := range []struct {
		ref  string
		want bool
	}{
		{"local/busybox", true}, // :latest implied
		{"local/busybox:latest", true},
		{"docker.io/local/busybox:latest", true},
		{"registry.example:5000/team/app:1", true},
		{dg.String(), true},
		{"local/busybox@" + dg.String(), true},
		{"local/busybox:v2", false},
		{"registry.example:5000/team/app:2", false},
		{digest.FromString("other").String(), false},
		{"", false},
	} {
		if got := namesImage(tc.ref, dg, names); got != tc.want {
			t.Errorf("namesImage(%q) = %v, want %v", tc.ref, got, tc.want)
		}
	}
}
