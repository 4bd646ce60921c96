package client

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	daemonv1 "github.com/shoal-dev/shoal/proto/shoal/daemon/v1"
)

// unavailableDaemon answers every Info with UNAVAILABLE, as statd does
// when `cluster join` cannot reach the member it was given.
type unavailableDaemon struct {
	daemonv1.UnimplementedDaemonServer
}

func (unavailableDaemon) Info(context.Context, *daemonv1.InfoRequest) (*daemonv1.InfoResponse, error) {
	return nil, status.Error(codes.Unavailable, "join through 10.0.0.1:7470: no route to host")
}

// An UNAVAILABLE that the daemon itself answered keeps its own message;
// only a daemon that could not be reached is explained as not reachable.
// Both keep the code.
func TestUnavailableExplainedOnlyWhenTheDaemonDidNotAnswer(t *testing.T) {
	dir := t.TempDir()
	retry := Retry{Attempts: 2, Initial: time.Millisecond, Max: time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	absent, err := Dial(dir, "statd", retry)
	if err != nil {
		t.Fatal(err)
	}
	defer absent.Close()
	_, err = Info(ctx, absent)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shoal-statd is not reachable at") {
		t.Fatalf("no daemon: got %v, want UNAVAILABLE saying shoal-statd is not reachable", err)
	}

	l, err := net.Listen("unix", filepath.Join(dir, "statd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	daemonv1.RegisterDaemonServer(srv, unavailableDaemon{})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	present, err := Dial(dir, "statd", retry)
	if err != nil {
		t.Fatal(err)
	}
	defer present.Close()
	_, err = Info(ctx, present)
	if status.Code(err) != codes.Unavailable || strings.Contains(err.Error(), "not reachable at") ||
		!strings.Contains(err.Error(), "join through 10.0.0.1:7470: no route to host") {
		t.Fatalf("the daemon answered UNAVAILABLE: got %v, want its own message, not that the daemon is not reachable", err)
	}
}
