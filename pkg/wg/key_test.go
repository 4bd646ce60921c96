package wg

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state", "wg.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if k1 == (wgtypes.Key{}) {
		t.Fatal("zero key")
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(path)
	if strings.TrimSpace(string(b)) != k1.String() {
		t.Fatalf("file holds %q, want %s", b, k1)
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil || k2 != k1 {
		t.Fatalf("reload: %v, %v", k2, err)
	}
	if PublicKey(k1) != k1.PublicKey() || PublicKey(k1) == k1 {
		t.Fatal("PublicKey")
	}
	// Loose permissions are tightened.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if k3, err := LoadOrCreateKey(path); err != nil || k3 != k1 {
		t.Fatalf("reload after chmod: %v, %v", k3, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode not fixed: %v", fi.Mode())
	}
	// A corrupt file is an error, never silently replaced.
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("corrupt key accepted")
	}
	if b, _ := os.ReadFile(path); string(b) != "not a key\n" {
		t.Fatal("corrupt key file overwritten")
	}
	// Concurrent first calls agree on one key.
	path2 := filepath.Join(dir, "race", "wg.key")
	keys := make([]wgtypes.Key, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := LoadOrCreateKey(path2)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys {
		if k != keys[0] {
			t.Fatal("concurrent callers got different keys")
		}
	}
	// No temporary files are left.
	for _, d := range []string{filepath.Dir(path), filepath.Dir(path2)} {
		ents, _ := os.ReadDir(d)
		if len(ents) != 1 {
			t.Errorf("%s holds %d files", d, len(ents))
		}
	}
}
