package ctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoal-dev/shoal/pkg/secret"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
)

func TestRegistryOf(t *testing.T) {
	for ref, want := range map[string]string{
		"ghcr.io/team/app:1":           "ghcr.io",
		"10.0.0.5:5000/app":            "10.0.0.5:5000",
		"localhost/app":                "localhost",
		"docker.io/library/busybox:1":  "docker.io",
		"local/busybox:latest":         "",
		"busybox":                      "",
		"team/app@sha256:0123456789ab": "",
	} {
		if got, ok := registryOf(ref); got != want || ok != (want != "") {
			t.Errorf("registryOf(%q) = %q, %v; want %q", ref, got, ok, want)
		}
	}
}

// TestFreeRegistryName: a replacement is named apart from every secret it
// replaces, within a secret name's 64 characters.
func TestFreeRegistryName(t *testing.T) {
	infos := func(names ...string) []*clusterv1.SecretInfo {
		var out []*clusterv1.SecretInfo
		for _, n := range names {
			out = append(out, &clusterv1.SecretInfo{Name: n})
		}
		return out
	}
	for _, tc := range []struct {
		old  []string
		want string
	}{
		{nil, "registry.ghcr.io"},
		{[]string{"registry.ghcr.io"}, "registry.ghcr.io-2"},
		{[]string{"registry.ghcr.io-2"}, "registry.ghcr.io"},
		{[]string{"registry.ghcr.io", "registry.ghcr.io-2"}, "registry.ghcr.io-3"},
	} {
		if got := freeRegistryName("ghcr.io", infos(tc.old...)); got != tc.want {
			t.Errorf("replacing %v: %q, want %q", tc.old, got, tc.want)
		}
	}
	long := strings.Repeat("a", 70) + ".example"
	base := secret.RegistryName(long)
	got := freeRegistryName(long, infos(base))
	if got == base || len(got) > 64 || secret.ValidName(got) != nil || !strings.HasSuffix(got, "-2") {
		t.Errorf("replacing %q: %q", base, got)
	}
}

// TestDockerCredentialsFromHelper: a login file that names a credential
// helper is answered by the helper, as docker answers it.
func TestDockerCredentialsFromHelper(t *testing.T) {
	dir := t.TempDir()
	helper := "#!/bin/sh\nread server\n[ \"$1:$server\" = get:ghcr.io ] && echo '{\"Username\":\"bot\",\"Secret\":\"s3cret\"}' && exit 0\necho 'credentials not found in native keychain'; exit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "docker-credential-ctltest"), []byte(helper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	data := []byte(`{"auths": {"ghcr.io": {}, "reg.example": {"auth": "dTpw"}}, "credHelpers": {"ghcr.io": "ctltest"}}`)
	user, pass, found, from, err := dockerCredentials(data, "/home/u/.docker/config.json", "ghcr.io")
	if err != nil || !found || user != "bot" || pass != "s3cret" || !strings.Contains(from, "docker-credential-ctltest") {
		t.Errorf("ghcr.io: %q %q %v from %q, %v", user, pass, found, from, err)
	}
	user, pass, found, from, err = dockerCredentials(data, "/home/u/.docker/config.json", "reg.example")
	if err != nil || !found || user != "u" || pass != "p" || from != "/home/u/.docker/config.json" {
		t.Errorf("reg.example (in auths): %q %q %v from %q, %v", user, pass, found, from, err)
	}
}
