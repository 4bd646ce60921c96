package rpc

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ToStatus maps a domain error to a gRPC status error. Errors that already
// carry a status pass through; context errors become CANCELLED or
// DEADLINE_EXCEEDED; errdefs classes map to their codes; anything else is
// UNKNOWN with its message.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errdefs.IsUnauthorized(err):
		// errgrpc has no mapping for this class.
		return status.Error(codes.Unauthenticated, err.Error())
	}
	return errgrpc.ToGRPC(err)
}

// FromStatus maps a gRPC error back to an errdefs class so client code can
// test it with errdefs.IsNotFound and friends.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	return errgrpc.ToNative(err)
}

// Code returns the gRPC code of err as ToStatus would map it.
func Code(err error) codes.Code { return status.Code(ToStatus(err)) }

// IsUnavailable reports whether err means the peer could not be reached.
func IsUnavailable(err error) bool {
	return status.Code(err) == codes.Unavailable || errdefs.IsUnavailable(err)
}

// ServerInterceptors returns the unary and stream interceptors every daemon
// installs: they log each call at debug level (failures at warn) and map
// returned errors to gRPC codes, so handlers return plain wrapped errors.
func ServerInterceptors(log *slog.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		logCall(log, info.FullMethod, start, err)
		return resp, ToStatus(err)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		start := time.Now()
		err := h(srv, ss)
		logCall(log, info.FullMethod, start, err)
		return ToStatus(err)
	}
	return unary, stream
}

func logCall(log *slog.Logger, method string, start time.Time, err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		log.Debug("rpc", "method", method, "duration", time.Since(start))
		return
	}
	lvl := slog.LevelDebug
	if c := Code(err); c == codes.Internal || c == codes.Unknown || c == codes.DataLoss {
		lvl = slog.LevelWarn
	}
	log.Log(context.Background(), lvl, "rpc failed", "method", method, "duration", time.Since(start), "code", Code(err).String(), "err", err)
}
