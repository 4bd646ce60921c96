package daemon

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// blockingHealth's Watch blocks until its stream's context ends, as a
// statd watch does.
type blockingHealth struct {
	healthpb.UnimplementedHealthServer
}

func (blockingHealth) Watch(_ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
	if err := s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	<-s.Context().Done()
	return s.Context().Err()
}

// TestStreamsEndWhenTheDaemonStops: an open stream ends at once when the
// daemon stops, with Unavailable (clients reconnect on it), so that
// GracefulStop does not wait for it.
func TestStreamsEndWhenTheDaemonStops(t *testing.T) {
	stopping, stop := context.WithCancel(context.Background())
	defer stop()
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(endStreamsOnStop(stopping)))
	healthpb.RegisterHealthServer(srv, blockingHealth{})
	sock := filepath.Join(t.TempDir(), "d.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}

	stop()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	_, err = w.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("the open stream ended with %v, want Unavailable", err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop still waits for the stream 10 s after the daemon began to stop")
	}
}
