package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Token format: SHOAL-<version>-<CA fingerprint>-<secret>. Neither hex nor
// base32 contains '-', so the dashes split it unambiguously.
const (
	tokenPrefix  = "SHOAL"
	tokenVersion = "1"
	secretBytes  = 32
)

// fingerprintLen is the length of a SHA-256 in hex.
const fingerprintLen = 64

var secretEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// secretLen is the length of the encoded secret: 52 characters.
var secretLen = secretEncoding.EncodedLen(secretBytes)

// ErrMalformedToken is wrapped by every ParseToken error.
var ErrMalformedToken = errors.New("malformed join token")

// Token is a join token: the CA fingerprint authenticates the cluster to
// the joining node (it pins the CA during the join handshake), the secret
// authenticates the joining node to the cluster.
type Token struct {
	// Fingerprint is the cluster CA's SHA-256 fingerprint, lowercase hex.
	Fingerprint string
	// Secret is 32 random bytes, lowercase unpadded base32.
	Secret string
}

// NewToken makes a token for the cluster of ca with a fresh secret. The
// cluster must store HashSecret(tok.Secret), never the secret.
func NewToken(ca *CA) (Token, error) {
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Token{}, fmt.Errorf("pki: token secret: %w", err)
	}
	return Token{
		Fingerprint: ca.Fingerprint(),
		Secret:      strings.ToLower(secretEncoding.EncodeToString(b[:])),
	}, nil
}

// String returns the token in its SHOAL-1-… form.
func (t Token) String() string {
	return tokenPrefix + "-" + tokenVersion + "-" + t.Fingerprint + "-" + t.Secret
}

// ParseToken parses a token as printed by String. It forgives surrounding
// whitespace and letter case (tokens get pasted through terminals, chat
// and YAML), and normalizes to lowercase. Errors never quote the secret, so
// they are safe to log.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Token{}, fmt.Errorf("%w: empty", ErrMalformedToken)
	}
	parts := strings.Split(s, "-")
	if !strings.EqualFold(parts[0], tokenPrefix) {
		return Token{}, fmt.Errorf("%w: does not start with %q", ErrMalformedToken, tokenPrefix+"-")
	}
	if len(parts) < 2 || parts[1] == "" {
		return Token{}, fmt.Errorf("%w: missing version", ErrMalformedToken)
	}
	if parts[1] != tokenVersion {
		return Token{}, fmt.Errorf("%w: unsupported version %q (this build understands %q)", ErrMalformedToken, truncate(parts[1], 8), tokenVersion)
	}
	if len(parts) != 4 {
		return Token{}, fmt.Errorf("%w: want 4 dash-separated fields (SHOAL-1-<fingerprint>-<secret>), got %d", ErrMalformedToken, len(parts))
	}
	fp := strings.ToLower(parts[2])
	if err := checkFingerprint(fp); err != nil {
		return Token{}, fmt.Errorf("%w: %v", ErrMalformedToken, err)
	}
	secret := strings.ToLower(parts[3])
	if err := checkSecret(secret); err != nil {
		return Token{}, fmt.Errorf("%w: %v", ErrMalformedToken, err)
	}
	return Token{Fingerprint: fp, Secret: secret}, nil
}

// checkFingerprint expects lowercase input.
func checkFingerprint(fp string) error {
	if len(fp) != fingerprintLen {
		return fmt.Errorf("CA fingerprint must be %d hex digits, got %d characters", fingerprintLen, len(fp))
	}
	if _, err := hex.DecodeString(fp); err != nil || strings.ToLower(fp) != fp {
		return errors.New("CA fingerprint is not lowercase hexadecimal")
	}
	return nil
}

// checkSecret expects lowercase input. It insists on the canonical
// encoding (zero trailing bits) so that one secret has one spelling and
// therefore one stored hash.
func checkSecret(secret string) error {
	if len(secret) != secretLen {
		return fmt.Errorf("secret must be %d base32 characters, got %d", secretLen, len(secret))
	}
	b, err := secretEncoding.DecodeString(strings.ToUpper(secret))
	if err != nil || len(b) != secretBytes {
		return errors.New("secret is not valid base32")
	}
	if strings.ToLower(secretEncoding.EncodeToString(b)) != secret {
		return errors.New("secret is not canonical base32")
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// hashPrefix names the scheme so that a later change can coexist with
// stored hashes of this one.
const hashPrefix = "sha256:"

// HashSecret returns what the cluster stores for a token secret in its
// replicated state. A plain (domain-separated) SHA-256 is enough: the
// secret is 256 random bits, so there is nothing for a slow password hash
// to protect against. Storing only the hash means that reading the state
// (a backup, a `shoalctl state` dump) does not yield a usable token.
func HashSecret(secret string) string {
	h := sha256.New()
	h.Write([]byte("shoal join secret v1\x00"))
	h.Write([]byte(strings.ToLower(secret)))
	return hashPrefix + hex.EncodeToString(h.Sum(nil))
}

// VerifySecret reports whether secret matches a hash from HashSecret, in
// time independent of where they differ.
func VerifySecret(secret, storedHash string) bool {
	if checkSecret(strings.ToLower(secret)) != nil {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(HashSecret(secret)), []byte(storedHash)) == 1
}
