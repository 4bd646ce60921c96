package dockerauth

import (
	"os"
	"path/filepath"
	"strings"
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

func TestHelper(t *testing.T) {
	for _, tc := range []struct{ file, host, want string }{
		{`{"auths": {"ghcr.io": {}}, "credsStore": "desktop"}`, "ghcr.io", "desktop"},
		{`{"credsStore": "desktop", "credHelpers": {"ghcr.io": "gh"}}`, "ghcr.io", "gh"},
		{`{"credsStore": "desktop", "credHelpers": {"ghcr.io": "gh"}}`, "quay.io", "desktop"},
		{`{"credHelpers": {"https://index.docker.io/v1/": "hub"}}`, "docker.io", "hub"},
		{`{"auths": {"ghcr.io": {"auth": "eDp5"}}}`, "ghcr.io", ""},
	} {
		if got, err := Helper([]byte(tc.file), tc.host); err != nil || got != tc.want {
			t.Errorf("Helper(%s, %s) = %q, %v; want %q", tc.file, tc.host, got, err, tc.want)
		}
	}
	if _, err := Helper([]byte(`{"credsStore": 5}`), "ghcr.io"); err == nil {
		t.Error("a credsStore that is not a string was accepted")
	}
}

// installHelper puts docker-credential-shoaltest on PATH: it knows
// ghcr.io's and Docker Hub's credentials, and fails with exit 3 for
// fail.example.
func installHelper(t *testing.T) {
	dir := t.TempDir()
	script := `#!/bin/sh
read server
case "$1:$server" in
get:ghcr.io) echo '{"ServerURL":"ghcr.io","Username":"bot","Secret":"s3cret"}' ;;
get:https://index.docker.io/v1/) echo '{"ServerURL":"https://index.docker.io/v1/","Username":"hub","Secret":"h"}' ;;
get:fail.example) echo "keychain locked"; exit 3 ;;
*) echo "credentials not found in native keychain"; exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "docker-credential-shoaltest"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func TestFromHelper(t *testing.T) {
	installHelper(t)
	for host, want := range map[string][2]string{"ghcr.io": {"bot", "s3cret"}, "docker.io": {"hub", "h"}} {
		user, pass, found, err := FromHelper("shoaltest", host)
		if err != nil || !found || user != want[0] || pass != want[1] {
			t.Errorf("%s: %q %q %v %v; want %v", host, user, pass, found, err, want)
		}
	}
	if _, _, found, err := FromHelper("shoaltest", "quay.io"); found || err != nil {
		t.Errorf("a host the helper does not hold: found %v, %v", found, err)
	}
	if _, _, _, err := FromHelper("shoaltest", "fail.example"); err == nil || !strings.Contains(err.Error(), "keychain locked") {
		t.Errorf("a failing helper: %v", err)
	}
	if _, _, _, err := FromHelper("missing-helper", "ghcr.io"); err == nil || !strings.Contains(err.Error(), "docker-credential-missing-helper") {
		t.Errorf("a helper that is not installed: %v", err)
	}
}
