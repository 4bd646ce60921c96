package daemon

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// endStreamsOnStop ends the open streams (watches, log follows, exec)
// once stopping is done: each stream's context is cancelled, and its
// caller gets Unavailable, on which Shoal's clients reconnect. Without it
// a stopping daemon's GracefulStop waited for its watchers until its
// timeout (5 s), and a restart of statd, which every other daemon
// watches, took that much longer.
func endStreamsOnStop(stopping context.Context) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		defer context.AfterFunc(stopping, cancel)()
		err := h(srv, &stopStream{ServerStream: ss, ctx: ctx})
		if stopping.Err() != nil {
			return status.Error(codes.Unavailable, "the daemon is stopping")
		}
		return err
	}
}

// stopStream is a server stream whose context endStreamsOnStop cancels.
type stopStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stopStream) Context() context.Context { return s.ctx }
