// Package rpc holds the gRPC plumbing shared by every Shoal daemon and
// client: Unix socket listeners with the right permissions, dialers, the
// server interceptors that map domain errors (containerd's errdefs) to gRPC
// status codes at the edge, the client options that retry UNAVAILABLE
// with backoff, and a TLS listener that lets a peer gRPC server share its
// port with protocols of its own (ALPNListener).
package rpc
