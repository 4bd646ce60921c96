package daemon

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// endStreamsOnStop ends the open streams (watches, log follows, exec)
// once stopping is closed: each stream's context is cancelled, and its
// caller gets Unavailable, on which Shoal's clients reconnect. Without it
// a stopping daemon's GracefulStop waited for its watchers until its
// timeout (5 s), and a restart of statd, which every other daemon
// watches, took that much longer.
func endStreamsOnStop(stopping <-chan struct{}) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		go func() {
			select {
			case <-stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := h(srv, &stopStream{ServerStream: ss, ctx: ctx})
		select {
		case <-stopping:
			return status.Error(codes.Unavailable, "the daemon is stopping")
		default:
			return err
		}
	}
}

// stopStream is a server stream whose context endStreamsOnStop cancels.
type stopStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stopStream) Context() context.Context { return s.ctx }
