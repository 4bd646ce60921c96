package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// clockSkew backdates every NotBefore: members have no shared clock, and a
// peer whose clock runs a little behind the issuer's must not reject a
// certificate that was issued a second ago.
const clockSkew = 5 * time.Minute

// MaxClusterName bounds cluster names so that "shoal-ca <name>" fits in the
// 64 characters X.509 allows a common name (RFC 5280 ub-common-name).
const MaxClusterName = 64 - len(caCNPrefix)

const (
	caCNPrefix  = "shoal-ca "
	caOrgPrefix = "shoal:"
)

// CA is the cluster certificate authority. Every member holds one, key
// included (see the package documentation for why). A CA is immutable and
// safe for concurrent use.
type CA struct {
	cert        *x509.Certificate
	key         *ecdsa.PrivateKey
	certPEM     []byte
	keyPEM      []byte
	fingerprint string
}

// NewCA creates the self-signed authority of a new cluster, valid from now
// (less clockSkew) for validity.
func NewCA(clusterName string, validity time.Duration, now time.Time) (*CA, error) {
	if err := validateClusterName(clusterName); err != nil {
		return nil, err
	}
	if validity <= 0 {
		return nil, fmt.Errorf("pki: CA validity must be positive, got %v", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:   caCNPrefix + clusterName,
			Organization: []string{caOrgPrefix + clusterName},
		},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// Node certificates are signed directly by the CA; a member that
		// holds the key has no reason to mint intermediates, and forbidding
		// them keeps chains two long and easy to reason about.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return LoadCA(pemBlock(pemCert, der), keyPEM)
}

// LoadCA parses a CA from PEM (as written by CertPEM and KeyPEM) and checks
// that the key belongs to the certificate, so a mismatched pair fails here
// rather than as unverifiable certificates later.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	ders, err := decodeCerts(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	if len(ders) != 1 {
		return nil, fmt.Errorf("pki: CA certificate: want exactly one certificate, found %d", len(ders))
	}
	cert, err := x509.ParseCertificate(ders[0])
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("pki: CA certificate is not a certificate authority")
	}
	if err := cert.CheckSignatureFrom(cert); err != nil {
		return nil, fmt.Errorf("pki: CA certificate is not self-signed: %w", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("pki: CA key does not match the CA certificate")
	}
	// Re-encode rather than keep the caller's bytes so that CertPEM and
	// KeyPEM are canonical (no stray blocks, comments or legacy key forms).
	canonKey, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{
		cert:        cert,
		key:         key,
		certPEM:     pemBlock(pemCert, cert.Raw),
		keyPEM:      canonKey,
		fingerprint: Fingerprint(cert),
	}, nil
}

// CertPEM returns the CA certificate, PEM encoded.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// KeyPEM returns the CA private key, PKCS #8 PEM encoded.
func (ca *CA) KeyPEM() []byte { return bytes.Clone(ca.keyPEM) }

// Cert returns the parsed CA certificate. Callers must not modify it.
func (ca *CA) Cert() *x509.Certificate { return ca.cert }

// Fingerprint returns the SHA-256 of the DER CA certificate in lowercase
// hex: what join tokens carry.
func (ca *CA) Fingerprint() string { return ca.fingerprint }

// ClusterName returns the name the CA was created with.
func (ca *CA) ClusterName() string {
	for _, o := range ca.cert.Subject.Organization {
		if name, ok := strings.CutPrefix(o, caOrgPrefix); ok {
			return name
		}
	}
	return strings.TrimPrefix(ca.cert.Subject.CommonName, caCNPrefix)
}

// Pool returns a new pool trusting only this CA. It is fresh on every call
// because x509.CertPool is mutable and shared pools invite accidents.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Fingerprint returns the SHA-256 of a certificate's DER in lowercase hex.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

func validateClusterName(name string) error {
	if name == "" {
		return errors.New("pki: empty cluster name")
	}
	if len(name) > MaxClusterName {
		return fmt.Errorf("pki: cluster name longer than %d bytes", MaxClusterName)
	}
	if !isNameChars(name) {
		return fmt.Errorf("pki: cluster name %q: only letters, digits, '.', '_' and '-' are allowed", name)
	}
	return nil
}

// isNameChars keeps names to characters that are valid in every place they
// end up: X.509 PrintableString-ish subjects, DNS SANs, file names, logs.
func isNameChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// randomSerial returns a positive 128-bit random serial. Random rather than
// sequential because any member may issue: there is no counter to share,
// and 128 bits make collisions between independent issuers negligible.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("pki: serial: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

const (
	pemCert = "CERTIFICATE"
	pemKey  = "PRIVATE KEY"
	pemEC   = "EC PRIVATE KEY"
	pemPub  = "PUBLIC KEY"
)

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// decodeCerts returns the DER of every CERTIFICATE block, in order, and
// rejects anything else so that a key pasted into a certificate file is not
// silently ignored.
func decodeCerts(data []byte) ([][]byte, error) {
	var ders [][]byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != pemCert {
			return nil, fmt.Errorf("unexpected PEM block %q", b.Type)
		}
		ders = append(ders, b.Bytes)
	}
	if len(ders) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	if len(bytes.TrimSpace(data)) != 0 {
		return nil, errors.New("trailing data after the last PEM block")
	}
	return ders, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pemBlock(pemKey, der), nil
}

// parseKey accepts PKCS #8 and SEC 1 ("EC PRIVATE KEY") P-256 keys: the
// latter is what openssl ecparam writes, which operators may bring.
func parseKey(data []byte) (*ecdsa.PrivateKey, error) {
	b, rest := pem.Decode(data)
	if b == nil {
		return nil, errors.New("no PEM private key found")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("trailing data after the private key")
	}
	var key any
	var err error
	switch b.Type {
	case pemKey:
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case pemEC:
		key, err = x509.ParseECPrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("unexpected PEM block %q", b.Type)
	}
	if err != nil {
		return nil, err
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("want an ECDSA P-256 key, got %T", key)
	}
	return ec, nil
}

// DeriveKey returns a size-byte key for purpose (HKDF-SHA256 over the CA
// private key). Every member holds the CA key, so every member derives
// the same key: what seals cluster data at rest (package secret) without
// another key to hand out at join.
func (ca *CA) DeriveKey(purpose string, size int) ([]byte, error) {
	priv, err := ca.key.Bytes()
	if err != nil {
		return nil, err
	}
	return hkdf.Key(sha256.New, priv, []byte(ca.fingerprint), purpose, size)
}
