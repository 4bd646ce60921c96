// Package secret names, seals and opens the cluster's secrets: small
// blobs (passwords, keys, certificates) that services read as files and
// that must not lie in plain text in cluster state.
//
// A secret lives in its /secrets/<name> document, which gossip carries to
// every node and every node keeps in its Pebble store: so its data is
// sealed (AES-256-GCM) with a key every member derives from the cluster CA
// key (pki.CA.DeriveKey), which every member holds anyway. A copy of a
// node's store, a state dump or a debug log shows only ciphertext; someone
// who holds a member's CA key can read the secrets, as they can already
// mint identities for any node (see package pki's trust model). This is
// Docker Swarm's posture without autolock: the Raft log is encrypted with
// a key kept beside it.
//
// The secret's name is bound into the seal as additional data, so a
// sealed value copied under another name does not open.
package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
)

// MaxSize bounds a secret's data: Docker Swarm's limit (500 KiB). A
// secret is a document field that gossip carries to every node, and a
// document may not exceed 1 MiB.
const MaxSize = 500 << 10

// KeySize is the length of a sealing key (AES-256).
const KeySize = 32

// KeyInfo is what pki.CA.DeriveKey is asked for: the sealing key's purpose.
const KeyInfo = "shoal secrets v1"

// version prefixes a sealed value, so that another seal can be told apart
// if one ever replaces this one.
const version byte = 1

var nameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]{0,62}[A-Za-z0-9])?$`)

// ValidName checks a secret's (or config's) name: 1 to 64 letters,
// digits, '_', '.' or '-', starting and ending with a letter or digit (it
// is a state key and, by default, a file name in the container). Callers
// put their noun before the error: "secret name … is invalid".
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("name %q is invalid: use 1-64 letters, digits, '_', '.' or '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// ErrOpen is returned when a sealed value does not open: another cluster's
// key, another secret's name, or damaged data.
var ErrOpen = errors.New("secret does not open with this cluster's key (sealed by another cluster, under another name, or damaged)")

// Seal encrypts data, secret name's value, with key.
func Seal(key []byte, name string, data []byte) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+aead.NonceSize(), 1+aead.NonceSize()+len(data)+aead.Overhead())
	out[0] = version
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, err
	}
	return aead.Seal(out, out[1:], data, additional(name)), nil
}

// Open decrypts what Seal returned for name.
func Open(key []byte, name string, sealed []byte) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	if len(sealed) < 1+aead.NonceSize()+aead.Overhead() || sealed[0] != version {
		return nil, ErrOpen
	}
	nonce, ct := sealed[1:1+aead.NonceSize()], sealed[1+aead.NonceSize():]
	data, err := aead.Open(nil, nonce, ct, additional(name))
	if err != nil {
		return nil, ErrOpen
	}
	return data, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secret: key is %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func additional(name string) []byte { return []byte("shoal secret " + name) }
