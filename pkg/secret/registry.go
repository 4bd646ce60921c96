package secret

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// RegistryLabel marks a secret that holds a registry's credentials for
// every node's pulls (`shoalctl registry login`): its value is the
// registry's host[:port], its data a file in the format `docker login`
// writes, naming that host alone.
const RegistryLabel = "io.shoal.registry"

// RegistryName is the name `shoalctl registry login` gives the secret of
// host's credentials: "registry." and the host, its characters a name
// cannot hold replaced (and a hash of it added if it is too long). The
// label, not the name, is what pulls look for.
func RegistryName(host string) string {
	var b strings.Builder
	for _, c := range host {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	name := "registry." + strings.Trim(b.String(), "_.-")
	if len(name) > 64 || ValidName(name) != nil {
		sum := sha256.Sum256([]byte(host))
		name = strings.TrimRight(name[:min(len(name), 51)], "_.-") + "-" + hex.EncodeToString(sum[:])[:12]
	}
	return name
}
