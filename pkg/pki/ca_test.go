package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

func TestIssueVerifyRoundTrip(t *testing.T) {
	ca := newCA(t, "home-lab")

	if got := ca.Cert().Subject.CommonName; got != "shoal-ca home-lab" {
		t.Fatalf("CA CN = %q", got)
	}
	if got := ca.Cert().Subject.Organization; len(got) != 1 || got[0] != "shoal:home-lab" {
		t.Fatalf("CA O = %q", got)
	}
	if got := ca.ClusterName(); got != "home-lab" {
		t.Fatalf("ClusterName = %q", got)
	}
	if !ca.Cert().IsCA || ca.Cert().KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("CA certificate is not a CA: IsCA=%v usage=%v", ca.Cert().IsCA, ca.Cert().KeyUsage)
	}
	fp := ca.Fingerprint()
	if len(fp) != 64 || strings.ToLower(fp) != fp {
		t.Fatalf("fingerprint %q: want 64 lowercase hex digits", fp)
	}
	if _, err := hex.DecodeString(fp); err != nil {
		t.Fatalf("fingerprint %q: %v", fp, err)
	}

	// The CA survives a PEM round trip with the same identity.
	ca2, err := LoadCA(ca.CertPEM(), ca.KeyPEM())
	if err != nil {
		t.Fatalf("LoadCA: %v", err)
	}
	if ca2.Fingerprint() != fp {
		t.Fatalf("fingerprint changed across LoadCA: %s vs %s", ca2.Fingerprint(), fp)
	}

	// The joining node's flow: key stays local, public key crosses as DER.
	key, err := NewNodeKey()
	if err != nil {
		t.Fatalf("NewNodeKey: %v", err)
	}
	der, err := MarshalPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatalf("MarshalPublicKey: %v", err)
	}
	pub, err := ParsePublicKey(der)
	if err != nil {
		t.Fatalf("ParsePublicKey: %v", err)
	}
	ips := []net.IP{net.ParseIP("10.0.0.7"), net.ParseIP("fd00::7"), net.ParseIP("10.0.0.7")}
	certPEM, err := ca2.IssueNode("node-7", ips, pub, nodeValidity, t0)
	if err != nil {
		t.Fatalf("IssueNode: %v", err)
	}
	keyPEM, err := EncodeKeyPEM(key)
	if err != nil {
		t.Fatalf("EncodeKeyPEM: %v", err)
	}
	id, err := LoadIdentity(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("LoadIdentity: %v", err)
	}

	leaf := id.Cert.Leaf
	if id.NodeID != "node-7" || leaf.Subject.CommonName != "node-7" {
		t.Fatalf("NodeID = %q, CN = %q", id.NodeID, leaf.Subject.CommonName)
	}
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "node-7" {
		t.Fatalf("DNS SANs = %q", leaf.DNSNames)
	}
	if len(leaf.IPAddresses) != 2 || !leaf.IPAddresses[0].Equal(ips[0]) || !leaf.IPAddresses[1].Equal(ips[1]) {
		t.Fatalf("IP SANs = %v, want 10.0.0.7 and fd00::7 once each", leaf.IPAddresses)
	}
	if !id.NotAfter.Equal(leaf.NotAfter) || leaf.NotAfter.Sub(t0) > nodeValidity || nodeValidity-leaf.NotAfter.Sub(t0) > time.Second {
		t.Fatalf("NotAfter = %v, want about %v", id.NotAfter, t0.Add(nodeValidity))
	}
	if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 128 {
		t.Fatalf("serial %v: want positive and at most 128 bits", leaf.SerialNumber)
	}
	if len(id.Cert.Certificate) != 2 || !bytes.Equal(id.Cert.Certificate[1], ca.Cert().Raw) {
		t.Fatalf("identity chain must be [leaf, CA], got %d certificates", len(id.Cert.Certificate))
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Fatalf("leaf does not verify for usage %v: %v", usage, err)
		}
	}
	// Another cluster's CA must not vouch for it.
	other := newCA(t, "home-lab")
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: other.Pool(), CurrentTime: t0}); err == nil {
		t.Fatalf("leaf verified under an unrelated CA with the same cluster name")
	}

	// The identity re-encodes to what it was loaded from.
	k2, err := id.KeyPEM()
	if err != nil {
		t.Fatalf("KeyPEM: %v", err)
	}
	if id2, err := LoadIdentity(id.CertPEM(), k2); err != nil || id2.NodeID != id.NodeID {
		t.Fatalf("LoadIdentity(CertPEM, KeyPEM) = %v, %v", id2, err)
	}
}

func TestSerialsDiffer(t *testing.T) {
	ca := newCA(t, "c")
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		s := newID(t, ca, "n").Cert.Leaf.SerialNumber.String()
		if seen[s] {
			t.Fatalf("serial %s issued twice", s)
		}
		seen[s] = true
	}
}

func TestNewCARejects(t *testing.T) {
	for _, name := range []string{"", "has space", "slash/no", strings.Repeat("a", MaxClusterName+1)} {
		if _, err := NewCA(name, caValidity, t0); err == nil {
			t.Fatalf("NewCA(%q) succeeded", name)
		}
	}
	if _, err := NewCA("ok", 0, t0); err == nil {
		t.Fatalf("NewCA with zero validity succeeded")
	}
	if _, err := NewCA(strings.Repeat("a", MaxClusterName), caValidity, t0); err != nil {
		t.Fatalf("NewCA with a %d-byte name: %v", MaxClusterName, err)
	}
}

func TestLoadCARejects(t *testing.T) {
	ca := newCA(t, "c")
	other := newCA(t, "c")
	id := newID(t, ca, "n")
	nodeKey, _ := id.KeyPEM()

	cases := []struct {
		name      string
		cert, key []byte
		want      string
	}{
		{"mismatched key", ca.CertPEM(), other.KeyPEM(), "does not match"},
		{"node certificate", id.CertPEM()[:len(id.CertPEM())-len(ca.CertPEM())], nodeKey, "not a certificate authority"},
		{"two certificates", append(ca.CertPEM(), other.CertPEM()...), ca.KeyPEM(), "exactly one"},
		{"key in cert file", ca.KeyPEM(), ca.KeyPEM(), "unexpected PEM block"},
		{"empty key", ca.CertPEM(), nil, "no PEM private key"},
		{"garbage", []byte("hello"), ca.KeyPEM(), "no PEM certificate"},
	}
	for _, c := range cases {
		_, err := LoadCA(c.cert, c.key)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: LoadCA error = %v, want one containing %q", c.name, err, c.want)
		}
	}
}

func TestLoadIdentityRejects(t *testing.T) {
	ca := newCA(t, "c")
	other := newCA(t, "c")
	id := newID(t, ca, "n")
	keyPEM, _ := id.KeyPEM()
	otherKey, _ := newID(t, ca, "m").KeyPEM()
	leafOnly := id.CertPEM()[:len(id.CertPEM())-len(ca.CertPEM())]

	cases := []struct {
		name      string
		cert, key []byte
		want      string
	}{
		{"leaf only", leafOnly, keyPEM, "leaf followed by the CA"},
		{"wrong key", id.CertPEM(), otherKey, "does not match"},
		{"wrong CA in chain", append(bytes.Clone(leafOnly), other.CertPEM()...), keyPEM, "not signed by the CA"},
		{"CA as leaf", append(ca.CertPEM(), ca.CertPEM()...), ca.KeyPEM(), "is a CA"},
	}
	for _, c := range cases {
		_, err := LoadIdentity(c.cert, c.key)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: LoadIdentity error = %v, want one containing %q", c.name, err, c.want)
		}
	}
}

func TestIssueNodeRejects(t *testing.T) {
	ca := newCA(t, "c")
	key, _ := NewNodeKey()
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)

	cases := []struct {
		name string
		node string
		ips  []net.IP
		pub  any
		now  time.Time
		want string
	}{
		{"empty node ID", "", nil, &key.PublicKey, t0, "empty node ID"},
		{"odd node ID", "a b", nil, &key.PublicKey, t0, "only letters"},
		{"long node ID", strings.Repeat("n", MaxNodeID+1), nil, &key.PublicKey, t0, "longer than"},
		{"P-384 key", "n", nil, &p384.PublicKey, t0, "P-256"},
		{"ed25519 key", "n", nil, edPub, t0, "P-256"},
		{"unspecified IP", "n", []net.IP{net.IPv4zero}, &key.PublicKey, t0, "unspecified"},
		{"invalid IP", "n", []net.IP{{1, 2}}, &key.PublicKey, t0, "invalid IP"},
		{"expired CA", "n", nil, &key.PublicKey, t0.Add(caValidity + time.Hour), "CA expired"},
	}
	for _, c := range cases {
		_, err := ca.IssueNode(c.node, c.ips, c.pub, nodeValidity, c.now)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: IssueNode error = %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := ParsePublicKey([]byte("junk")); err == nil {
		t.Fatalf("ParsePublicKey accepted junk")
	}
}

func TestIssueNodeClampsToCA(t *testing.T) {
	ca, err := NewCA("c", 24*time.Hour, t0)
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	id, err := ca.NewIdentity("n", nil, 30*24*time.Hour, t0)
	if err != nil {
		t.Fatalf("NewIdentity: %v", err)
	}
	if id.NotAfter.After(ca.Cert().NotAfter) {
		t.Fatalf("node NotAfter %v outlives the CA's %v", id.NotAfter, ca.Cert().NotAfter)
	}
}

func TestRenewal(t *testing.T) {
	ca := newCA(t, "c")
	key, _ := NewNodeKey()
	ips := []net.IP{net.ParseIP("192.0.2.1")}
	certPEM, err := ca.IssueNode("n1", ips, &key.PublicKey, 90*time.Hour, t0)
	if err != nil {
		t.Fatalf("IssueNode: %v", err)
	}
	keyPEM, _ := EncodeKeyPEM(key)
	id, err := LoadIdentity(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("LoadIdentity: %v", err)
	}
	// The window is 90h plus the clockSkew backdating; a third of it is
	// just over 30h.
	if NeedsRenewal(id, t0) {
		t.Fatalf("fresh identity needs renewal")
	}
	if NeedsRenewal(id, t0.Add(59*time.Hour)) {
		t.Fatalf("identity with 31h of 90h left needs renewal")
	}
	if !NeedsRenewal(id, t0.Add(61*time.Hour)) {
		t.Fatalf("identity with 29h of 90h left does not need renewal")
	}
	if !NeedsRenewal(id, t0.Add(100*time.Hour)) {
		t.Fatalf("expired identity does not need renewal")
	}
	if !NeedsRenewal(nil, t0) {
		t.Fatalf("missing identity does not need renewal")
	}

	later := t0.Add(61 * time.Hour)
	renewed, err := Renew(ca, id, 90*time.Hour, later)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if renewed.NodeID != "n1" {
		t.Fatalf("renewed NodeID = %q", renewed.NodeID)
	}
	if !renewed.Cert.Leaf.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Fatalf("renewal changed the key")
	}
	if got := renewed.Cert.Leaf.IPAddresses; len(got) != 1 || !got[0].Equal(ips[0]) {
		t.Fatalf("renewed IPs = %v", got)
	}
	if renewed.Cert.Leaf.SerialNumber.Cmp(id.Cert.Leaf.SerialNumber) == 0 {
		t.Fatalf("renewal reused the serial")
	}
	if !renewed.NotAfter.After(id.NotAfter) || NeedsRenewal(renewed, later) {
		t.Fatalf("renewed NotAfter %v (old %v) does not extend the identity", renewed.NotAfter, id.NotAfter)
	}
}

func TestRandomSerialRange(t *testing.T) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for i := 0; i < 100; i++ {
		s, err := randomSerial()
		if err != nil {
			t.Fatalf("randomSerial: %v", err)
		}
		if s.Sign() <= 0 || s.Cmp(limit) >= 0 {
			t.Fatalf("serial %v out of range", s)
		}
	}
}

func TestDeriveKey(t *testing.T) {
	now := time.Now()
	a, err := NewCA("one", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCA("two", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	// The same CA loaded again (as another member holds it) derives the
	// same key; another CA or purpose does not.
	a2, err := LoadCA(a.CertPEM(), a.KeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	k1, err := a.DeriveKey("p", 32)
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := a2.DeriveKey("p", 32)
	k3, _ := a.DeriveKey("q", 32)
	k4, _ := b.DeriveKey("p", 32)
	if len(k1) != 32 || !bytes.Equal(k1, k2) {
		t.Fatalf("a member's key differs: %x %x", k1, k2)
	}
	if bytes.Equal(k1, k3) || bytes.Equal(k1, k4) {
		t.Fatal("another purpose or CA derives the same key")
	}
}
