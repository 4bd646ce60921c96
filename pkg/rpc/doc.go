// Package rpc holds the gRPC plumbing shared by every Shoal daemon and
// client: Unix socket listeners with the right permissions, dialers, the
// server interceptors that map domain errors (containerd's errdefs) to gRPC
// status codes at the edge, and the client options that retry UNAVAILABLE
// with backoff.
package rpc
