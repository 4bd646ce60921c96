package runtime

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// DockerConfigAuth returns credentials for registry hosts from the file at
// path, in the format `docker login` writes (~/.docker/config.json:
// {"auths": {"HOST[:PORT]": {"auth": base64("USER:PASSWORD")}}}, or
// "username" and "password" in place of "auth"), so an operator can copy
// that file to each node. It reads the file at every call: a changed
// file applies to the next pull, without a restart. A missing file, or a
// host it does not name, gives no credentials (an anonymous pull).
// Docker Hub's entry may be keyed as Docker writes it,
// "https://index.docker.io/v1/".
func DockerConfigAuth(path string) func(host string) (string, string, error) {
	return func(host string) (string, string, error) {
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return "", "", nil
		}
		if err != nil {
			return "", "", fmt.Errorf("registry credentials: %w", err)
		}
		user, pass, _, err := DockerConfigCredentials(data, host)
		if err != nil {
			return "", "", fmt.Errorf("registry credentials %s: %w", path, err)
		}
		return user, pass, nil
	}
}

// DockerConfigCredentials finds host's credentials in data, a file in
// the format `docker login` writes; found is false if it names no such
// host.
func DockerConfigCredentials(data []byte, host string) (user, pass string, found bool, err error) {
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
	keys := []string{host, "https://" + host, "http://" + host}
	if host == "registry-1.docker.io" || host == "docker.io" {
		keys = append(keys, "https://index.docker.io/v1/", "docker.io", "index.docker.io")
	}
	for _, k := range keys {
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
