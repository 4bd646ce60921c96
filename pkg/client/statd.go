package client

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Statd is a client of shoal-statd's local API.
type Statd struct {
	statev1.StateClient
	// Cluster is statd's cluster membership API on the same connection.
	Cluster clusterv1.ClusterClient
	// Secrets is statd's secrets API on the same connection.
	Secrets clusterv1.SecretsClient
	Conn    *grpc.ClientConn
	retry   Retry
}

// NewStatd returns a client of the statd socket in runDir.
func NewStatd(runDir string, retry Retry) (*Statd, error) {
	conn, err := Dial(runDir, "statd", retry)
	if err != nil {
		return nil, err
	}
	return &Statd{StateClient: statev1.NewStateClient(conn), Cluster: clusterv1.NewClusterClient(conn), Secrets: clusterv1.NewSecretsClient(conn), Conn: conn, retry: retry.withDefaults()}, nil
}

// Close closes the connection.
func (c *Statd) Close() error { return c.Conn.Close() }

// Watch follows changes under prefix after revision after, calling fn with
// every response, and survives statd restarts and broken connections: it
// reconnects with backoff and resumes after the last revision it delivered,
// so fn sees every change exactly once. It returns when ctx ends, when fn
// fails, or on an error that reconnecting cannot fix (a compacted
// revision, bad input). after == FromNow starts from the current revision.
func (c *Statd) Watch(ctx context.Context, prefix string, after uint64, fn func(*statev1.WatchResponse) error) error {
	return c.watch(ctx, prefix, after, false, fn)
}

// WatchMeta is Watch with per-field stamps and tombstones in every
// document.
func (c *Statd) WatchMeta(ctx context.Context, prefix string, after uint64, fn func(*statev1.WatchResponse) error) error {
	return c.watch(ctx, prefix, after, true, fn)
}

func (c *Statd) watch(ctx context.Context, prefix string, after uint64, meta bool, fn func(*statev1.WatchResponse) error) error {
	failures := 0
	for {
		err := c.watchOnce(ctx, prefix, &after, meta, fn, &failures)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fnErr callbackError
		if errors.As(err, &fnErr) {
			return fnErr.err
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.Canceled, codes.Internal, codes.Unknown:
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(c.retry.Backoff(failures)):
		}
		failures++
	}
}

// FromNow as Watch's after starts at the current revision.
const FromNow = ^uint64(0)

type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

func (c *Statd) watchOnce(ctx context.Context, prefix string, after *uint64, meta bool, fn func(*statev1.WatchResponse) error, failures *int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &statev1.WatchRequest{Prefix: prefix, WithMeta: meta}
	if *after != FromNow {
		req.AfterRevision = after
	}
	stream, err := c.StateClient.Watch(ctx, req)
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return status.Error(codes.Unavailable, "watch stream ended")
		}
		if err != nil {
			return err
		}
		*failures = 0
		// NB: advance the resume point before calling fn only for what fn
		// has been handed; a crash inside fn is the caller's to handle.
		if err := fn(resp); err != nil {
			return callbackError{err}
		}
		if *after == FromNow || resp.GetRevision() > *after {
			*after = resp.GetRevision()
		}
	}
}
