package dockerauth

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	auth := File(path)
	if u, p, err := auth("reg.example:5000"); u != "" || p != "" || err != nil {
		t.Fatalf("no file: %q %q %v, want anonymous", u, p, err)
	}
	// "shoal:s3cret:with:colons" in base64; Docker Hub keyed as docker
	// login keys it; one entry with separate fields.
	if err := os.WriteFile(path, []byte(`{"auths": {
		"reg.example:5000": {"auth": "c2hvYWw6czNjcmV0OndpdGg6Y29sb25z"},
		"https://index.docker.io/v1/": {"auth": "aHViOmh1YnBhc3M="},
		"plain.example": {"username": "u", "password": "p"},
		"bad.example": {"auth": "not base64!"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string][2]string{
		"reg.example:5000":     {"shoal", "s3cret:with:colons"},
		"registry-1.docker.io": {"hub", "hubpass"},
		"plain.example":        {"u", "p"},
		"other.example":        {"", ""},
	} {
		if u, p, err := auth(host); u != want[0] || p != want[1] || err != nil {
			t.Errorf("%s: %q %q %v, want %q %q", host, u, p, err, want[0], want[1])
		}
	}
	if _, _, err := auth("bad.example"); err == nil {
		t.Error("an auth that is not base64 gave no error")
	}
	if err := os.WriteFile(path, []byte(`{"auths":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth("reg.example:5000"); err == nil {
		t.Error("a file that is not JSON gave no error")
	}
}

func TestSameRegistry(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"docker.io", "registry-1.docker.io", true},
		{"index.docker.io", "docker.io", true},
		{"ghcr.io", "ghcr.io", true},
		{"ghcr.io", "docker.io", false},
		{"10.0.0.5:5000", "10.0.0.5", false},
	} {
		if got := SameRegistry(tc.a, tc.b); got != tc.same {
			t.Errorf("SameRegistry(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}
