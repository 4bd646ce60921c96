package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// File names under a node's PKI directory.
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
)

// SaveFiles writes the CA and the node identity into dir (created 0700 if
// missing): certificates 0644, keys 0600. Each file is replaced atomically
// (temporary file, fsync, rename, fsync of the directory), so a crash
// leaves either the old or the new content, never a torn file. Files whose
// content is unchanged are not rewritten: a renewal touches only node.crt,
// and since Renew keeps the key, any crash leaves a matching pair.
//
// The four files are not replaced as one unit: if a key and its
// certificate both change (a new identity, not a renewal) and a crash falls
// between the two renames, LoadFiles reports the mismatch rather than
// loading it.
func SaveFiles(dir string, ca *CA, id *Identity) error {
	if ca == nil || id == nil {
		return errors.New("pki: SaveFiles needs both a CA and an identity")
	}
	if err := checkIdentityCA(ca, id); err != nil {
		return err
	}
	nodeKey, err := id.KeyPEM()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	files := []struct {
		name string
		data []byte
		perm fs.FileMode
	}{
		{CAKeyFile, ca.KeyPEM(), 0o600},
		{CACertFile, ca.CertPEM(), 0o644},
		{NodeKeyFile, nodeKey, 0o600},
		{NodeCertFile, id.CertPEM(), 0o644},
	}
	for _, f := range files {
		if err := writeFileAtomic(dir, f.name, f.data, f.perm); err != nil {
			return fmt.Errorf("pki: write %s: %w", f.name, err)
		}
	}
	return nil
}

// LoadFiles reads what SaveFiles wrote and checks that the node identity
// was issued by the CA. A missing file yields an error wrapping
// fs.ErrNotExist: the node has not been initialized or joined yet.
func LoadFiles(dir string) (*CA, *Identity, error) {
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
		return b, nil
	}
	var data [4][]byte
	for i, name := range []string{CACertFile, CAKeyFile, NodeCertFile, NodeKeyFile} {
		b, err := read(name)
		if err != nil {
			return nil, nil, err
		}
		data[i] = b
	}
	ca, err := LoadCA(data[0], data[1])
	if err != nil {
		return nil, nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	id, err := LoadIdentity(data[2], data[3])
	if err != nil {
		return nil, nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	if err := checkIdentityCA(ca, id); err != nil {
		return nil, nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	return ca, id, nil
}

// checkIdentityCA insists that the CA an identity carries in its chain is
// the cluster's: a node presenting another CA would fail every handshake
// for reasons far from the cause.
func checkIdentityCA(ca *CA, id *Identity) error {
	if len(id.Cert.Certificate) != 2 || !bytes.Equal(id.Cert.Certificate[1], ca.cert.Raw) {
		return errors.New("pki: node certificate was not issued by this cluster CA")
	}
	if id.Cert.Leaf == nil || id.Cert.Leaf.CheckSignatureFrom(ca.cert) != nil {
		return errors.New("pki: node certificate was not issued by this cluster CA")
	}
	return nil
}

func writeFileAtomic(dir, name string, data []byte, perm fs.FileMode) error {
	path := filepath.Join(dir, name)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		// Still fix the mode: an operator may have loosened it.
		return os.Chmod(path, perm)
	}
	// CreateTemp makes the file 0600 from the start, so a key is never
	// readable by others even for the moment before Chmod.
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return syncDir(dir)
}

// syncDir makes a rename durable: without it the directory entry may still
// point at the old file after a power loss.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
