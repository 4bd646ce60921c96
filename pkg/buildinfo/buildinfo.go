// Package buildinfo reports the version every Shoal binary was built as.
// `make build` sets Version with -ldflags; a plain `go build` falls back to
// the VCS revision Go records in the binary.
package buildinfo

import "runtime/debug"

// Version is set at link time: -X github.com/shoal-dev/shoal/pkg/buildinfo.Version=...
var Version = ""

// String returns the version, or the VCS revision, or "dev".
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			if dirty {
				rev += "-dirty"
			}
			return "dev-" + rev
		}
	}
	return "dev"
}
