package ctl

import "testing"

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
