// Package pki is Shoal's cluster public-key infrastructure: the cluster CA,
// node certificates, join tokens, and the TLS configurations every peer
// connection uses.
//
// # Trust model
//
// A cluster is defined by one self-signed ECDSA P-256 CA (NewCA). A node is
// a member exactly when it presents a certificate signed by that CA, whose
// common name is its node ID (IssueNode). All peer traffic is mutual TLS
// 1.3; peers verify each other by the CA signature, never by host name,
// because peers are dialed by IP addresses that change and the CA, not DNS,
// decides who is a member. A dialer that knows whom it means to reach
// (ClientConfig's expectNodeID) also checks the server's node ID.
//
// Shoal has no masters, so any member must be able to admit a new node,
// and therefore every member holds the CA private key: it is handed over,
// with the CA certificate and the new node's certificate, inside the TLS
// join exchange. A consequence worth stating plainly: compromising any one
// member compromises the cluster (the thief can mint identities for any
// node ID). That is the price of having no special nodes; a design with a
// few key-holding "admitter" nodes, or threshold signing, would reintroduce
// the masters Shoal exists to avoid. Protect ca.key like a root password
// (SaveFiles writes it 0600 in a 0700 directory).
//
// # Joining
//
// A join token, SHOAL-1-<CA fingerprint>-<secret>, carries two things:
//
//   - the SHA-256 fingerprint of the CA certificate, which authenticates
//     the cluster to the joining node. The joiner has no CA yet, so it
//     dials with JoinClientConfig, which accepts the server only if the
//     chain the server sends contains a CA certificate with exactly that
//     fingerprint and the server's leaf is signed by it. A man in the
//     middle cannot present such a chain without the CA key, so he can
//     neither read the secret the joiner then sends nor hand it a CA of his
//     own. This is why every member sends its CA certificate along with its
//     leaf (Identity.Cert.Certificate is [leaf, CA]).
//   - a 256-bit random secret, which authenticates the joiner to the
//     cluster. The cluster keeps only HashSecret(secret) in its replicated
//     state, so reading the state does not yield a usable token; rotating a
//     token is replacing that hash. The secret is high-entropy, so a fast
//     hash suffices and VerifySecret compares in constant time.
//
// The joiner generates its key locally (NewNodeKey) and sends only the
// public key (MarshalPublicKey); private keys never cross the network
// except the CA key, by design, inside the verified TLS channel. There is
// no CSR and hence no proof of possession: a token holder could obtain a
// certificate for someone else's public key, which gains him nothing he
// could use, while a token holder gets the CA key anyway. A token is thus
// as powerful as membership; keep them short-lived and rotate them.
//
// # Rotation
//
// Node certificates are short-lived relative to the CA, and any member can
// renew its own with its local CA copy, with no network round trip:
// NeedsRenewal says when (less than a third of the validity left), Renew
// re-issues for the same node ID, IPs and key. ServerConfig and
// ClientConfig read the identity through a getter on every handshake, so
// swapping an atomic.Pointer[Identity] rotates it without restarting
// listeners or redialing; connections already open keep the old
// certificate until they reconnect, which is harmless while it is valid.
// ServerConfig disables session tickets so every connection is verified
// afresh against the current CA pool.
//
// # Trade-offs and limits
//
//   - No revocation (no CRL/OCSP): a removed node's certificate stays valid
//     until it expires. The RPC layer should authorize a verified peer
//     against membership (a tombstoned /nodes/<id> refuses), and node
//     validity should be short (days) to bound the window.
//   - CA rotation is not implemented. The TLS configs take a pool getter so
//     that a transition pool trusting old and new CA can be introduced
//     later without changing their callers; the CA's own lifetime should be
//     long (years). IssueNode refuses to issue once the CA has expired and
//     clamps node certificates to the CA's NotAfter.
//   - Certificates are backdated by a few minutes (clockSkew) to tolerate
//     clock skew between members; larger skews cause handshake failures.
//   - Node IDs and cluster names are restricted to letters, digits, '.',
//     '_' and '-' (ValidateNodeID), at most 64 bytes, because they become
//     X.509 names.
package pki
