package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// MaxNodeID is the longest node ID a certificate can carry: the X.509
// upper bound on a common name, which is also Shoal's own limit on node IDs
// in CRDT stamps.
const MaxNodeID = 64

// ValidateNodeID reports whether id can name a node in a certificate (as
// the CN and a DNS SAN). statd should apply it to configured node IDs at
// startup, so a bad ID fails there and not at the first join.
func ValidateNodeID(id string) error {
	if id == "" {
		return errors.New("pki: empty node ID")
	}
	if len(id) > MaxNodeID {
		return fmt.Errorf("pki: node ID longer than %d bytes", MaxNodeID)
	}
	if !isNameChars(id) {
		return fmt.Errorf("pki: node ID %q: only letters, digits, '.', '_' and '-' are allowed", id)
	}
	return nil
}

// NewNodeKey generates a node's private key. The key never leaves the
// node: a joining node sends only the public half (MarshalPublicKey) and
// gets back a certificate for it.
func NewNodeKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate node key: %w", err)
	}
	return key, nil
}

// EncodeKeyPEM encodes a node key as PKCS #8 PEM, the form LoadIdentity
// and the key files use.
func EncodeKeyPEM(key *ecdsa.PrivateKey) ([]byte, error) { return encodeKey(key) }

// MarshalPublicKey encodes a public key as PKIX DER, for the join request.
func MarshalPublicKey(pub crypto.PublicKey) ([]byte, error) {
	if err := checkNodePublicKey(pub); err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("pki: encode public key: %w", err)
	}
	return der, nil
}

// ParsePublicKey decodes a PKIX DER public key received in a join request
// and rejects anything but ECDSA P-256, so that the cluster's certificates
// stay uniform whatever a joining node sends.
func ParsePublicKey(der []byte) (crypto.PublicKey, error) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse public key: %w", err)
	}
	if err := checkNodePublicKey(pub); err != nil {
		return nil, err
	}
	return pub, nil
}

func checkNodePublicKey(pub crypto.PublicKey) error {
	ec, ok := pub.(*ecdsa.PublicKey)
	if !ok || ec == nil {
		return fmt.Errorf("pki: node key must be ECDSA P-256, got %T", pub)
	}
	if ec.Curve != elliptic.P256() {
		return fmt.Errorf("pki: node key must be ECDSA P-256, got curve %s", ec.Curve.Params().Name)
	}
	return nil
}

// IssueNode signs a certificate binding nodeID (CN and DNS SAN) and ips (IP
// SANs) to pub, valid for both TLS server and client auth. It returns the
// leaf followed by the CA certificate: every node presents that whole chain
// so that a joining node, which knows only the CA's fingerprint, can find
// and check the CA in the handshake.
//
// The validity is clamped to the CA's: a leaf that outlives its issuer
// would only fail verification later with a more confusing error.
func (ca *CA) IssueNode(nodeID string, ips []net.IP, pub crypto.PublicKey, validity time.Duration, now time.Time) ([]byte, error) {
	if err := ValidateNodeID(nodeID); err != nil {
		return nil, err
	}
	if err := checkNodePublicKey(pub); err != nil {
		return nil, err
	}
	if validity <= 0 {
		return nil, fmt.Errorf("pki: certificate validity must be positive, got %v", validity)
	}
	if !now.Before(ca.cert.NotAfter) {
		return nil, fmt.Errorf("pki: the cluster CA expired at %s", ca.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	sans, err := cleanIPs(ips)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notBefore := now.Add(-clockSkew)
	if notBefore.Before(ca.cert.NotBefore) {
		notBefore = ca.cert.NotBefore
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:   nodeID,
			Organization: ca.cert.Subject.Organization,
		},
		DNSNames:              []string{nodeID},
		IPAddresses:           sans,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign node certificate: %w", err)
	}
	out := pemBlock(pemCert, der)
	return append(out, ca.certPEM...), nil
}

// cleanIPs normalizes and deduplicates IP SANs and refuses unspecified
// addresses, which would name no one (0.0.0.0 is a listen address, not a
// peer's).
func cleanIPs(ips []net.IP) ([]net.IP, error) {
	var out []net.IP
	for _, ip := range ips {
		if ip.To16() == nil {
			return nil, fmt.Errorf("pki: invalid IP address %v", ip)
		}
		if ip.IsUnspecified() {
			return nil, fmt.Errorf("pki: unspecified IP address %v cannot name a node", ip)
		}
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		if !slices.ContainsFunc(out, ip.Equal) {
			out = append(out, slices.Clone(ip))
		}
	}
	return out, nil
}

// NewIdentity generates a key and issues a certificate for it in one step:
// for the node that runs `cluster init` and holds the CA itself.
func (ca *CA) NewIdentity(nodeID string, ips []net.IP, validity time.Duration, now time.Time) (*Identity, error) {
	key, err := NewNodeKey()
	if err != nil {
		return nil, err
	}
	certPEM, err := ca.IssueNode(nodeID, ips, &key.PublicKey, validity, now)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return LoadIdentity(certPEM, keyPEM)
}

// Identity is a node's TLS identity. It is immutable once loaded: rotation
// builds a new Identity and swaps the pointer that the TLS configs' getID
// returns (an atomic.Pointer[Identity] and its Load method fit).
type Identity struct {
	// Cert has Certificate = [leaf DER, CA DER], Leaf parsed and
	// PrivateKey set. The CA rides along so that joining nodes can pin it
	// by fingerprint.
	Cert tls.Certificate
	// NodeID is the leaf's common name.
	NodeID string
	// NotAfter is when the leaf expires.
	NotAfter time.Time
}

// LoadIdentity parses a node certificate chain (leaf then CA, as IssueNode
// returns) and its key. It checks the shape and the signature between the
// two, but not the time: an expired identity must still load so that the
// node can renew it with its own copy of the CA.
func LoadIdentity(certPEM, keyPEM []byte) (*Identity, error) {
	ders, err := decodeCerts(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: node certificate: %w", err)
	}
	if len(ders) != 2 {
		return nil, fmt.Errorf("pki: node certificate: want the leaf followed by the CA certificate, found %d certificate(s)", len(ders))
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: node key: %w", err)
	}
	leaf, err := x509.ParseCertificate(ders[0])
	if err != nil {
		return nil, fmt.Errorf("pki: node certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(ders[1])
	if err != nil {
		return nil, fmt.Errorf("pki: node certificate chain: CA: %w", err)
	}
	if !key.PublicKey.Equal(leaf.PublicKey) {
		return nil, errors.New("pki: node key does not match the node certificate")
	}
	if leaf.IsCA {
		return nil, errors.New("pki: node certificate is a CA certificate")
	}
	if !caCert.IsCA {
		return nil, errors.New("pki: node certificate chain: second certificate is not a CA")
	}
	if err := leaf.CheckSignatureFrom(caCert); err != nil {
		return nil, fmt.Errorf("pki: node certificate is not signed by the CA in its chain: %w", err)
	}
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return nil, errors.New("pki: node certificate lacks server or client auth usage")
	}
	if err := ValidateNodeID(leaf.Subject.CommonName); err != nil {
		return nil, fmt.Errorf("pki: node certificate: %w", err)
	}
	return &Identity{
		Cert: tls.Certificate{
			Certificate: [][]byte{leaf.Raw, caCert.Raw},
			PrivateKey:  key,
			Leaf:        leaf,
		},
		NodeID:   leaf.Subject.CommonName,
		NotAfter: leaf.NotAfter,
	}, nil
}

// CertPEM returns the chain (leaf then CA) as PEM, the node.crt format.
func (id *Identity) CertPEM() []byte {
	var b bytes.Buffer
	for _, der := range id.Cert.Certificate {
		_ = pem.Encode(&b, &pem.Block{Type: pemCert, Bytes: der})
	}
	return b.Bytes()
}

// KeyPEM returns the node key as PKCS #8 PEM, the node.key format.
func (id *Identity) KeyPEM() ([]byte, error) {
	key, ok := id.Cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: node key is %T, want *ecdsa.PrivateKey", id.Cert.PrivateKey)
	}
	return encodeKey(key)
}

// NeedsRenewal reports whether less than a third of the identity's validity
// remains (or it has none). A third leaves room for several retries of a
// failed renewal before peers start rejecting the node, whatever the
// configured validity.
func NeedsRenewal(id *Identity, now time.Time) bool {
	if id == nil || id.Cert.Leaf == nil {
		return true
	}
	// NotBefore is backdated by clockSkew; the validity asked for starts
	// clockSkew later. Counting the backdate would make short-lived
	// certificates look permanently due.
	total := id.Cert.Leaf.NotAfter.Sub(id.Cert.Leaf.NotBefore) - clockSkew
	return id.Cert.Leaf.NotAfter.Sub(now) < total/3
}

// Renew issues a fresh certificate for the same node ID, IPs and key. The
// key is kept so that renewal needs no coordination: nothing else has to
// learn a new public key, and a crash between writing the new certificate
// and anything else leaves a consistent pair on disk.
func Renew(ca *CA, id *Identity, validity time.Duration, now time.Time) (*Identity, error) {
	if id == nil || id.Cert.Leaf == nil {
		return nil, errors.New("pki: renew: no identity to renew")
	}
	key, ok := id.Cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: renew: node key is %T, want *ecdsa.PrivateKey", id.Cert.PrivateKey)
	}
	certPEM, err := ca.IssueNode(id.NodeID, id.Cert.Leaf.IPAddresses, &key.PublicKey, validity, now)
	if err != nil {
		return nil, fmt.Errorf("pki: renew: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return LoadIdentity(certPEM, keyPEM)
}
