package runtime

import "testing"

func TestPullableRef(t *testing.T) {
	for ref, want := range map[string]string{
		"registry.example/app:1":         "registry.example/app:1",
		"10.0.0.1:5000/team/app":         "10.0.0.1:5000/team/app:latest",
		"localhost/app":                  "localhost/app:latest",
		"docker.io/library/busybox:1.36": "docker.io/library/busybox:1.36",
	} {
		got, err := PullableRef(ref)
		if err != nil || got != want {
			t.Errorf("PullableRef(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	for _, ref := range []string{"busybox", "local/busybox:latest", "team/app:1", "Bad Ref"} {
		if got, err := PullableRef(ref); err == nil {
			t.Errorf("PullableRef(%q) = %q; want an error", ref, got)
		}
	}
}

func TestPlainHTTP(t *testing.T) {
	entries := []string{"reg.local:5000", "plain.example", "10.99.0.0/16"}
	for host, want := range map[string]bool{
		"reg.local:5000":     true,
		"reg.local:5001":     false,
		"plain.example:8080": true,
		"10.99.3.1:5000":     true,
		"10.98.3.1:5000":     false,
		"docker.io":          false,
	} {
		if got := plainHTTP(entries, host); got != want {
			t.Errorf("plainHTTP(%q) = %v, want %v", host, got, want)
		}
	}
}
