package pki

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFilesRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca := newCA(t, "c")
	id := newID(t, ca, "node-a")
	if err := SaveFiles(dir, ca, id); err != nil {
		t.Fatalf("SaveFiles: %v", err)
	}

	modes := map[string]fs.FileMode{CACertFile: 0o644, CAKeyFile: 0o600, NodeCertFile: 0o644, NodeKeyFile: 0o600}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("ReadDir: %v", err)
	}
	if len(entries) != len(modes) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("dir holds %v, want exactly the four files (no temporaries)", names)
	}
	for name, want := range modes {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("stat %s: %v", name, err)
		}
		if got := st.Mode().Perm(); got != want {
			t.Fatalf("%s mode %o, want %o", name, got, want)
		}
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %o, want 700", st.Mode().Perm())
	}

	ca2, id2, err := LoadFiles(dir)
	if err != nil {
		t.Fatalf("LoadFiles: %v", err)
	}
	if ca2.Fingerprint() != ca.Fingerprint() || id2.NodeID != "node-a" ||
		id2.Cert.Leaf.SerialNumber.Cmp(id.Cert.Leaf.SerialNumber) != 0 {
		t.Fatalf("LoadFiles returned a different CA or identity")
	}
}

func TestSaveFilesRenewalTouchesOnlyNodeCert(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "c")
	id := newID(t, ca, "node-a")
	if err := SaveFiles(dir, ca, id); err != nil {
		t.Fatalf("SaveFiles: %v", err)
	}
	before := map[string]os.FileInfo{}
	for _, n := range []string{CACertFile, CAKeyFile, NodeCertFile, NodeKeyFile} {
		before[n], _ = os.Stat(filepath.Join(dir, n))
	}
	renewed, err := Renew(ca, id, nodeValidity, time.Now())
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if err := SaveFiles(dir, ca, renewed); err != nil {
		t.Fatalf("SaveFiles after renewal: %v", err)
	}
	for n, old := range before {
		now, _ := os.Stat(filepath.Join(dir, n))
		same := os.SameFile(old, now)
		if n == NodeCertFile && same {
			t.Fatalf("%s was not replaced", n)
		}
		if n != NodeCertFile && !same {
			t.Fatalf("%s was rewritten although unchanged", n)
		}
	}
	_, id2, err := LoadFiles(dir)
	if err != nil {
		t.Fatalf("LoadFiles: %v", err)
	}
	if id2.Cert.Leaf.SerialNumber.Cmp(renewed.Cert.Leaf.SerialNumber) != 0 {
		t.Fatalf("LoadFiles returned the old certificate")
	}
}

func TestSaveFilesTightensModes(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "c")
	id := newID(t, ca, "node-a")
	if err := SaveFiles(dir, ca, id); err != nil {
		t.Fatalf("SaveFiles: %v", err)
	}
	key := filepath.Join(dir, CAKeyFile)
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatalf("chmod: %v", err)
	}
	if err := SaveFiles(dir, ca, id); err != nil {
		t.Fatalf("SaveFiles: %v", err)
	}
	if st, _ := os.Stat(key); st.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key left at %o", st.Mode().Perm())
	}
}

func TestLoadFilesErrors(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := LoadFiles(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("LoadFiles on an empty dir: %v, want fs.ErrNotExist", err)
	}

	ca, other := newCA(t, "c"), newCA(t, "c")
	foreign := newID(t, other, "node-a")
	if err := SaveFiles(dir, ca, foreign); err == nil || !strings.Contains(err.Error(), "not issued by this cluster CA") {
		t.Fatalf("SaveFiles with a foreign identity: %v", err)
	}

	// A node.crt from another cluster dropped in by hand.
	if err := SaveFiles(dir, ca, newID(t, ca, "node-a")); err != nil {
		t.Fatalf("SaveFiles: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, NodeCertFile), foreign.CertPEM(), 0o644); err != nil {
		t.Fatalf("write: %v", err)
	}
	if _, _, err := LoadFiles(dir); err == nil {
		t.Fatalf("LoadFiles accepted a node certificate of another cluster")
	}
}
