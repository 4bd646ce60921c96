package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNoIdentity is returned from a handshake when getID has nothing yet.
var ErrNoIdentity = errors.New("pki: no node identity")

// ServerConfig returns the configuration of a member's peer listener. It
// serves getID()'s certificate on every handshake, so swapping the identity
// rotates it without restarting the listener, and it verifies a client
// certificate against pool() when one is offered.
//
// Client certificates are optional at the TLS layer because a joining node
// has none yet; the RPC layer must require PeerNodeID for every method but
// Join.
//
// Each handshake runs with a per-connection copy of the returned config
// (through GetConfigForClient) so that pool() is read afresh; the copy is
// made when the handshake starts, so fields the caller sets on the returned
// config before serving (NextProtos, Time, …) carry over. grpc-go's
// credentials.NewTLS handles GetConfigForClient (it re-adds "h2").
func ServerConfig(getID func() *Identity, pool func() *x509.CertPool) *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			id := getID()
			if id == nil {
				return nil, ErrNoIdentity
			}
			return &id.Cert, nil
		},
		ClientAuth: tls.VerifyClientCertIfGiven,
		// Tickets would let a client resume with a certificate that was
		// verified against an older pool; peer connections are long-lived,
		// so a full handshake each time costs nothing that matters.
		SessionTicketsDisabled: true,
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		p := pool()
		if p == nil {
			return nil, errors.New("pki: no cluster CA pool")
		}
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = p
		return c, nil
	}
	return base
}

// PeerNodeID returns the node ID of a client whose certificate the server
// verified against the cluster CA during the handshake (ServerConfig). It
// reports false for a client without a certificate, the joining case, and
// for anything this package's server would not have verified: on the
// client side of a connection it always reports false.
func PeerNodeID(state tls.ConnectionState) (string, bool) {
	if len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return "", false
	}
	leaf := state.VerifiedChains[0][0]
	// Every member holds the CA key and could present the CA certificate
	// itself; it names no node.
	if leaf.IsCA {
		return "", false
	}
	id := leaf.Subject.CommonName
	if ValidateNodeID(id) != nil {
		return "", false
	}
	return id, true
}

// ClientConfig returns the configuration for dialing a member. It presents
// getID()'s certificate and verifies the server's chain against pool(),
// ignoring host names: peers are dialed by IP, which can change under
// DHCP, and the CA signature is what makes a member. When expectNodeID is
// not empty the server's certificate must also name that node, which
// defeats a member answering on another member's address.
//
// Verification runs in VerifyConnection, so it also applies to resumed
// sessions and survives the config being cloned (as grpc-go does).
func ClientConfig(getID func() *Identity, pool func() *x509.CertPool, expectNodeID string) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			id := getID()
			if id == nil {
				return nil, ErrNoIdentity
			}
			return &id.Cert, nil
		},
		// Standard verification checks the host name, which is exactly
		// what Shoal does not want; VerifyConnection does the rest.
		InsecureSkipVerify: true,
	}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		p := pool()
		if p == nil {
			return errors.New("pki: no cluster CA pool")
		}
		leaf, err := verifyServerChain(cs.PeerCertificates, p, now(cfg))
		if err != nil {
			return err
		}
		if expectNodeID != "" && leaf.Subject.CommonName != expectNodeID {
			return fmt.Errorf("pki: server is node %q, want %q", leaf.Subject.CommonName, expectNodeID)
		}
		return nil
	}
	return cfg
}

// JoinClientConfig returns the configuration a node without a CA uses to
// reach any member and join. It trusts the server only if the chain the
// server presents contains a CA certificate with exactly the token's
// fingerprint and the leaf is signed by that CA: the token is the only
// thing the joining node knows, and this is what keeps a man in the middle
// from collecting the token's secret (and, in exchange, handing out its own
// CA). It presents no client certificate.
func JoinClientConfig(fingerprint string) (*tls.Config, error) {
	fingerprint = strings.ToLower(fingerprint)
	if err := checkFingerprint(fingerprint); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // verified against the fingerprint below
	}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		return verifyJoinServer(cs.PeerCertificates, fingerprint, now(cfg))
	}
	return cfg, nil
}

func verifyJoinServer(certs []*x509.Certificate, want string, now time.Time) error {
	if len(certs) == 0 {
		return errors.New("pki: server presented no certificate")
	}
	if len(certs) == 1 {
		return fmt.Errorf("pki: server did not send its CA certificate, so it cannot be checked against the token's fingerprint %s", want)
	}
	var ca *x509.Certificate
	for _, c := range certs[1:] {
		if Fingerprint(c) == want {
			ca = c
			break
		}
	}
	if ca == nil {
		return fmt.Errorf("pki: server's CA fingerprint %s does not match the token's %s", Fingerprint(certs[len(certs)-1]), want)
	}
	if !ca.BasicConstraintsValid || !ca.IsCA {
		return fmt.Errorf("pki: certificate with the token's fingerprint %s is not a CA", want)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := verifyLeaf(certs[0], roots, nil, now); err != nil {
		return fmt.Errorf("pki: server certificate is not valid under the token's CA: %w", err)
	}
	return nil
}

func verifyServerChain(certs []*x509.Certificate, roots *x509.CertPool, now time.Time) (*x509.Certificate, error) {
	if len(certs) == 0 {
		return nil, errors.New("pki: server presented no certificate")
	}
	// No intermediates: node certificates are signed by the CA directly
	// (it has MaxPathLen 0), and the CA copy the server sends along is for
	// joining nodes; members trust their own copy in roots.
	if _, err := verifyLeaf(certs[0], roots, nil, now); err != nil {
		return nil, fmt.Errorf("pki: server certificate: %w", err)
	}
	return certs[0], nil
}

func verifyLeaf(leaf *x509.Certificate, roots, inter *x509.CertPool, now time.Time) ([][]*x509.Certificate, error) {
	if leaf.IsCA {
		return nil, errors.New("presented a CA certificate as its own")
	}
	return leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// now honours tls.Config.Time for the checks this package does itself, as
// crypto/tls does for its own, so tests and simulations can move the clock.
// It reads the config the constructor returned, not later clones of it.
func now(cfg *tls.Config) time.Time {
	if cfg.Time != nil {
		return cfg.Time()
	}
	return time.Now()
}
