// Package dockerauth reads registry credentials in the format `docker
// login` writes (~/.docker/config.json's "auths"): for schedd's pulls,
// from its registry_auth file or the cluster's stored credentials, and
// for shoalctl's --with-registry-auth, from the user's own file or the
// credential helper it names (credsStore, credHelpers).
package dockerauth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	helperclient "github.com/docker/docker-credential-helpers/client"
	"github.com/docker/docker-credential-helpers/credentials"
)

// File returns credentials for registry hosts from the file at
// path, in the format `docker login` writes (~/.docker/config.json:
// {"auths": {"HOST[:PORT]": {"auth": base64("USER:PASSWORD")}}}, or
// "username" and "password" in place of "auth"), so an operator can copy
// that file to each node. It reads the file at every call: a changed
// file applies to the next pull, without a restart. A missing file, or a
// host it does not name, gives no credentials (an anonymous pull).
// Docker Hub's entry may be keyed as Docker writes it,
// "https://index.docker.io/v1/".
func File(path string) func(host string) (string, string, error) {
	return func(host string) (string, string, error) {
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return "", "", nil
		}
		if err != nil {
			return "", "", fmt.Errorf("registry credentials: %w", err)
		}
		user, pass, _, err := Credentials(data, host)
		if err != nil {
			return "", "", fmt.Errorf("registry credentials %s: %w", path, err)
		}
		return user, pass, nil
	}
}

// Credentials finds host's credentials in data, a file in
// the format `docker login` writes; found is false if it names no such
// host.
func Credentials(data []byte, host string) (user, pass string, found bool, err error) {
	var cfg struct {
		Auths map[string]struct {
			Auth     string `json:"auth"`
			Username string `json:"username"`
			Password string `json:"password"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return "", "", false, err
	}
	for _, k := range hostKeys(host) {
		a, ok := cfg.Auths[k]
		if !ok {
			continue
		}
		if a.Auth == "" {
			return a.Username, a.Password, true, nil
		}
		raw, err := base64.StdEncoding.DecodeString(a.Auth)
		user, pass, ok := strings.Cut(string(raw), ":")
		if err != nil || !ok {
			return "", "", false, fmt.Errorf("the auth of %s is not base64 of USER:PASSWORD", k)
		}
		return user, pass, true, nil
	}
	return "", "", false, nil
}

// Helper is the credential helper data (a docker login file) names for
// host: its credHelpers entry, else its credsStore, else "" (the
// credentials, if any, are in its auths). Docker asks a helper first.
func Helper(data []byte, host string) (string, error) {
	var cfg struct {
		CredsStore  string            `json:"credsStore"`
		CredHelpers map[string]string `json:"credHelpers"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return "", err
	}
	for _, k := range hostKeys(host) {
		if h := cfg.CredHelpers[k]; h != "" {
			return h, nil
		}
	}
	return cfg.CredsStore, nil
}

// FromHelper asks credential helper name (the program
// docker-credential-NAME, as docker runs it) for host's credentials;
// found is false if it holds none.
func FromHelper(name, host string) (user, pass string, found bool, err error) {
	server := host
	if IsDockerHub(host) {
		server = "https://index.docker.io/v1/" // the key docker login stores Docker Hub's under
	}
	c, err := helperclient.Get(helperclient.NewShellProgramFunc("docker-credential-"+name), server)
	if credentials.IsErrCredentialsNotFound(err) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("credential helper docker-credential-%s: %w", name, err)
	}
	return c.Username, c.Secret, true, nil
}

// hostKeys are the keys a docker login file may hold host's entry under.
func hostKeys(host string) []string {
	keys := []string{host, "https://" + host, "http://" + host}
	if IsDockerHub(host) {
		keys = append(keys, "https://index.docker.io/v1/", "docker.io", "index.docker.io", "registry-1.docker.io")
	}
	return keys
}

// IsDockerHub reports whether host is one of Docker Hub's names: a pull
// from docker.io asks registry-1.docker.io, and docker login keys it
// https://index.docker.io/v1/.
func IsDockerHub(host string) bool {
	switch host {
	case "docker.io", "index.docker.io", "registry-1.docker.io", "https://index.docker.io/v1/":
		return true
	}
	return false
}

// SameRegistry reports whether a and b name one registry.
func SameRegistry(a, b string) bool { return a == b || (IsDockerHub(a) && IsDockerHub(b)) }

// ConfigPath is the docker login file of this user: $DOCKER_CONFIG/config.json,
// else ~/.docker/config.json.
func ConfigPath() (string, error) {
	if dir := os.Getenv("DOCKER_CONFIG"); dir != "" {
		return filepath.Join(dir, "config.json"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".docker", "config.json"), nil
}
