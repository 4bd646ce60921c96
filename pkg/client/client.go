// Package client has the typed clients of the Shoal daemons' local APIs.
//
// Every client dials <run-dir>/<daemon>.sock lazily, retries calls that
// fail with UNAVAILABLE (daemon restarting, socket not there yet) with
// exponential backoff for a bounded time, and when it gives up returns an
// UNAVAILABLE error that says which daemon, which socket, and what to check.
package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/rpc"
	daemonv1 "github.com/shoal-dev/shoal/proto/shoal/daemon/v1"
)

// DefaultRunDir is where daemons put their sockets unless told otherwise.
const DefaultRunDir = "/run/shoal"

// RunDirFromEnv returns $SHOAL_RUN_DIR, or DefaultRunDir.
func RunDirFromEnv() string {
	if d := os.Getenv("SHOAL_RUN_DIR"); d != "" {
		return d
	}
	return DefaultRunDir
}

// Retry bounds how long calls keep retrying UNAVAILABLE.
type Retry struct {
	// Attempts is the most tries per call (default 5).
	Attempts int
	// Initial and Max bound the backoff between tries (100ms, 1s).
	Initial, Max time.Duration
}

func (r Retry) withDefaults() Retry {
	if r.Attempts <= 0 {
		r.Attempts = 5
	}
	if r.Initial <= 0 {
		r.Initial = 100 * time.Millisecond
	}
	if r.Max <= 0 {
		r.Max = time.Second
	}
	return r
}

// Backoff returns the pause before retry number attempt (0-based), with
// jitter, so that many clients of one restarting daemon spread out.
func (r Retry) Backoff(attempt int) time.Duration {
	r = r.withDefaults()
	d := r.Initial << min(attempt, 16)
	if d > r.Max {
		d = r.Max
	}
	return d/2 + rand.N(d/2+1)
}

// Dial returns a connection to the named daemon's socket in runDir. It does
// not block: the first call connects.
//
// runDir may also be ssh://[user@]host[:port][/run/dir]: the daemon of
// another node, through ssh (see sshScheme).
func Dial(runDir, name string, retry Retry) (*grpc.ClientConn, error) {
	path := SocketPath(runDir, name)
	dial := rpc.DialUnix(path)
	if u, remote, err := parseSSH(runDir); err != nil {
		return nil, err
	} else if remote {
		dial = dialSSH(u, name)
	}
	retry = retry.withDefaults()
	ri := retryInterceptor{daemon: name, path: path, retry: retry}
	return grpc.NewClient("passthrough:///"+name,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithChainUnaryInterceptor(ri.unary),
		grpc.WithChainStreamInterceptor(ri.stream),
	)
}

type retryInterceptor struct {
	daemon, path string
	retry        Retry
}

func (ri retryInterceptor) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var err error
	var answered peer.Peer
	opts = append(opts, grpc.Peer(&answered))
	for attempt := 0; attempt < ri.retry.Attempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(ri.retry.Backoff(attempt - 1)):
			case <-ctx.Done():
				return ri.explainUnanswered(err, answered)
			}
		}
		answered = peer.Peer{}
		err = invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) != codes.Unavailable {
			return err
		}
	}
	return ri.explainUnanswered(err, answered)
}

// explainUnanswered explains an UNAVAILABLE as explain does, unless the
// daemon itself answered with it: then something beyond it is not
// reachable (a peer that `cluster join` dials, say), and saying that the
// daemon is not would send the user the wrong way.
func (ri retryInterceptor) explainUnanswered(err error, answered peer.Peer) error {
	if answered.Addr != nil {
		return err
	}
	return ri.explain(err)
}

// stream retries opening a stream; once it is open, errors go to the
// caller, who knows how to resume (see Statd.Watch).
func (ri retryInterceptor) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	var err error
	for attempt := 0; attempt < ri.retry.Attempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(ri.retry.Backoff(attempt - 1)):
			case <-ctx.Done():
				return nil, ri.explain(err)
			}
		}
		var s grpc.ClientStream
		s, err = streamer(ctx, desc, cc, method, opts...)
		if status.Code(err) != codes.Unavailable {
			return s, err
		}
	}
	return nil, ri.explain(err)
}

// explain turns a bare UNAVAILABLE into one that says what to do, keeping
// the code so callers can still test for it.
func (ri retryInterceptor) explain(err error) error {
	if status.Code(err) != codes.Unavailable {
		return err
	}
	hint := fmt.Sprintf("is it running? try `systemctl status shoal-%s`", ri.daemon)
	if strings.HasPrefix(ri.path, sshScheme+"://") {
		hint = fmt.Sprintf("does ssh reach that node, and shoal-%s run there?", ri.daemon)
	}
	return status.Errorf(codes.Unavailable, "shoal-%s is not reachable at %s (%s): %s", ri.daemon, ri.path, hint, status.Convert(err).Message())
}

// Info asks any daemon to describe itself.
func Info(ctx context.Context, conn *grpc.ClientConn) (*daemonv1.InfoResponse, error) {
	return daemonv1.NewDaemonClient(conn).Info(ctx, &daemonv1.InfoRequest{})
}

// Daemons lists the daemons of a node, in the order `daemon status` shows.
var Daemons = []string{"statd", "schedd", "netd", "vold"}

// ErrNotReachable formats a failed dial for humans.
func ErrNotReachable(name, runDir string, err error) error {
	return fmt.Errorf("shoal-%s at %s: %w", name, SocketPath(runDir, name), err)
}
