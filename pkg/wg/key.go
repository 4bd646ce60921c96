package wg

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// LoadOrCreateKey returns the WireGuard private key stored at path
// (base64, as `wg genkey` prints it), creating it first if the file does
// not exist. A new key is written to a temporary file (0600) in the same
// directory, synced, and linked into place only if path still does not
// exist, so concurrent callers agree on one key and a crash never leaves a
// partial file. An existing file readable by others is made 0600. A file
// that does not hold a key is an error, not a reason to make a new key: a
// new key would strand every peer configured with the old one.
func LoadOrCreateKey(path string) (wgtypes.Key, error) {
	if k, err := loadKey(path); err == nil || !errors.Is(err, os.ErrNotExist) {
		return k, err
	}
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wg: generate key: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return wgtypes.Key{}, fmt.Errorf("wg: key dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".wg-key-*") // 0600
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wg: write key: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(k.String() + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wg: write key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) { // another process won the race
			return loadKey(path)
		}
		return wgtypes.Key{}, fmt.Errorf("wg: write key: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return k, nil
}

func loadKey(path string) (wgtypes.Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return wgtypes.Key{}, err
	}
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wg: key file %s: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return wgtypes.Key{}, fmt.Errorf("wg: key file %s is mode %v and cannot be made 0600: %w", path, fi.Mode().Perm(), err)
		}
	}
	return k, nil
}

// PublicKey is the public key of private key k.
func PublicKey(k wgtypes.Key) wgtypes.Key { return k.PublicKey() }
