package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/buildinfo"
	"github.com/shoal-dev/shoal/pkg/rpc"
	daemonv1 "github.com/shoal-dev/shoal/proto/shoal/daemon/v1"
)

// Spec describes one daemon to Main.
type Spec struct {
	// Name is the short name: statd, schedd, netd, vold. The binary is
	// shoal-<Name>, the socket <run-dir>/<Name>.sock.
	Name string
	// Short and Long are the --help texts.
	Short, Long string
	// MetricsPort is the default loopback port of the metrics endpoint.
	MetricsPort int
	// Config returns the daemon's config with its defaults filled in. The
	// value must be a pointer to a struct that embeds Common; Main sets the
	// Common defaults before calling Flags.
	Config func(Common) Configurable
	// Flags binds the daemon's own flags to fields of cfg.
	Flags func(fs *pflag.FlagSet, cfg any)
	// Start loads state, registers gRPC services on rt.GRPC and starts
	// background work bound to ctx. It returns a function that releases
	// what Start acquired; Main calls it after gRPC has stopped serving.
	Start func(ctx context.Context, rt *Runtime) (stop func(context.Context) error, err error)
}

// Runtime is what a daemon's Start gets from Main.
type Runtime struct {
	Name    string
	Config  any
	Common  Common
	Log     *slog.Logger
	GRPC    *grpc.Server
	Health  *health.Server
	Metrics *prometheus.Registry
	// Details, when set, adds daemon-specific lines to Info responses.
	Details func() map[string]string
	// Liveness, when set, runs before every systemd watchdog ping; the
	// ping is skipped when it fails or does not return within the ping
	// interval, so systemd restarts a daemon that runs but no longer works
	// (a wedged store, a deadlock), not only one that died. It must be
	// cheap: a trivial read, not a round trip to a peer.
	Liveness func(ctx context.Context) error

	started time.Time
	ready   chan struct{}
	fatal   chan error
}

// Fatal asks Main to shut the daemon down and exit non-zero. Background
// work calls it when it cannot go on.
func (rt *Runtime) Fatal(err error) {
	select {
	case rt.fatal <- err:
	default:
	}
}

// SocketPath returns <run-dir>/<name>.sock for any daemon.
func SocketPath(runDir, name string) string { return filepath.Join(runDir, name+".sock") }

// Main runs the daemon described by spec with command-line args and returns
// the process exit code.
func Main(spec Spec, args []string) int {
	common := defaultCommon(spec.Name, spec.MetricsPort)
	cfg := spec.Config(common)
	var configPath string
	var printConfig bool
	exit := 0
	cmd := &cobra.Command{
		Use:           "shoal-" + spec.Name,
		Short:         spec.Short,
		Long:          spec.Long,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.String(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadConfig(cmd.Flags(), configPath, cmd.Flags().Changed("config"), cfg); err != nil {
				return err
			}
			if printConfig {
				s, err := DumpConfig(cfg)
				if err != nil {
					return err
				}
				fmt.Print(s)
				return nil
			}
			return run(spec, cfg)
		},
	}
	fs := cmd.Flags()
	bindCommonFlags(fs, cfg.common(), &configPath, spec.Name)
	fs.BoolVar(&printConfig, "print-config", false, "print the effective configuration as TOML and exit")
	if spec.Flags != nil {
		spec.Flags(fs, cfg)
	}
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "shoal-%s: %v\n", spec.Name, err)
		exit = 1
	}
	return exit
}

func run(spec Spec, cfg Configurable) error {
	c := *cfg.common()
	log, err := newLogger(c.LogLevel, c.LogFormat)
	if err != nil {
		return err
	}
	log = log.With("daemon", spec.Name)

	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	unlock, err := lockStateDir(c.StateDir, spec.Name)
	if err != nil {
		return err
	}
	defer unlock()

	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	bgCtx, cancelBg := context.WithCancel(context.Background())
	defer cancelBg()

	unary, stream := rpc.ServerInterceptors(log)
	stopping, stopStreams := context.WithCancel(context.Background()) // done when the daemon stops serving
	defer stopStreams()
	rt := &Runtime{
		Name:    spec.Name,
		Config:  cfg,
		Common:  c,
		Log:     log,
		GRPC:    grpc.NewServer(grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(endStreamsOnStop(stopping), stream)),
		Health:  health.NewServer(),
		Metrics: prometheus.NewRegistry(),
		started: time.Now(),
		ready:   make(chan struct{}),
		fatal:   make(chan error, 1),
	}
	rt.Metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rt.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(rt.GRPC, rt.Health)
	reflection.Register(rt.GRPC)
	daemonv1.RegisterDaemonServer(rt.GRPC, &infoServer{rt: rt})

	var metricsSrv *http.Server
	if c.DebugPprof && c.MetricsAddr == "" {
		return errors.New("--debug-pprof needs --metrics-addr (a loopback address)")
	}
	if c.MetricsAddr != "" {
		ml, err := net.Listen("tcp", c.MetricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener on %s: %w (set --metrics-addr, or empty to disable)", c.MetricsAddr, err)
		}
		handler, err := metricsHandler(rt.Metrics, ml.Addr(), c.DebugPprof)
		if err != nil {
			ml.Close()
			return err
		}
		metricsSrv = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		go metricsSrv.Serve(ml)
		defer metricsSrv.Close()
	}

	log.Info("starting", "version", buildinfo.String(), "state_dir", c.StateDir, "run_dir", c.RunDir)
	stopDaemon, err := spec.Start(bgCtx, rt)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := stopDaemon(sctx); err != nil {
			log.Error("stop", "err", err)
		}
	}()

	lis, activated, err := listen(SocketPath(c.RunDir, spec.Name))
	if err != nil {
		return err
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- rt.GRPC.Serve(lis) }()
	rt.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	close(rt.ready)
	if _, err := sddaemon.SdNotify(false, sddaemon.SdNotifyReady); err != nil {
		log.Warn("sd_notify ready", "err", err)
	}
	log.Info("ready", "socket", lis.Addr().String(), "socket_activated", activated, "startup", time.Since(rt.started).Round(time.Millisecond))

	if wd, err := sddaemon.SdWatchdogEnabled(false); err == nil && wd > 0 {
		notify := func() { sddaemon.SdNotify(false, sddaemon.SdNotifyWatchdog) }
		go watchdog(bgCtx, wd/2, rt.Liveness, notify, log)
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", "signal")
	case runErr = <-rt.fatal:
		log.Error("shutting down", "reason", "fatal", "err", runErr)
	case err := <-serveErr:
		runErr = fmt.Errorf("grpc serve: %w", err)
	}
	sddaemon.SdNotify(false, sddaemon.SdNotifyStopping)
	rt.Health.Shutdown()
	stopStreams()
	gracefulStop(rt.GRPC, 5*time.Second)
	cancelBg()
	if !activated {
		os.Remove(SocketPath(c.RunDir, spec.Name))
	}
	return runErr
}

// listen takes the daemon's socket from systemd when socket-activated and
// creates it otherwise.
func listen(path string) (net.Listener, bool, error) {
	ls, err := activation.Listeners()
	if err != nil {
		return nil, false, fmt.Errorf("socket activation: %w", err)
	}
	for _, l := range ls {
		if l != nil && l.Addr().Network() == "unix" {
			return l, true, nil
		}
	}
	l, err := rpc.ListenUnix(path)
	return l, false, err
}

func gracefulStop(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		s.Stop() // open watch streams would otherwise hold shutdown forever
	}
}

// watchdog pings systemd every interval while live (when set) passes.
func watchdog(ctx context.Context, every time.Duration, live func(context.Context) error, notify func(), log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	var pending chan error // a check that has not returned yet
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if live != nil {
			if pending == nil {
				pending = make(chan error, 1)
				go func(done chan<- error) {
					cctx, cancel := context.WithTimeout(ctx, every)
					defer cancel()
					done <- live(cctx)
				}(pending)
			}
			var err error
			select {
			case err = <-pending:
				pending = nil
			case <-time.After(every):
				// NB: a check that ignores its context may never return;
				// it is waited for at the next ticks rather than started
				// again, so a wedged daemon does not pile up goroutines.
				err = fmt.Errorf("liveness check did not return within %v", every)
			case <-ctx.Done():
				return
			}
			if err != nil {
				log.Warn("watchdog ping skipped", "err", err)
				continue
			}
		}
		notify()
	}
}

// lockStateDir takes an exclusive flock on <state-dir>/<name>.lock, which
// the kernel releases however the process dies. The file names the holder's
// PID so the refusal can say who holds it.
func lockStateDir(dir, name string) (func(), error) {
	path := filepath.Join(dir, name+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(holder))
			if pid == "" {
				pid = "unknown"
			}
			return nil, fmt.Errorf("state dir %s is in use by another shoal-%s (pid %s); stop it or use another --state-dir", dir, name, pid)
		}
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if os.Getenv("JOURNAL_STREAM") != "" {
		// journald stamps every line itself.
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

type infoServer struct {
	daemonv1.UnimplementedDaemonServer
	rt *Runtime
}

func (s *infoServer) Info(context.Context, *daemonv1.InfoRequest) (*daemonv1.InfoResponse, error) {
	resp := &daemonv1.InfoResponse{
		Name:     s.rt.Name,
		Version:  buildinfo.String(),
		Started:  timestamppb.New(s.rt.started),
		Pid:      int64(os.Getpid()),
		StateDir: s.rt.Common.StateDir,
	}
	select {
	case <-s.rt.ready:
		resp.Ready = true
	default:
	}
	if s.rt.Details != nil {
		resp.Details = s.rt.Details()
	}
	return resp, nil
}
