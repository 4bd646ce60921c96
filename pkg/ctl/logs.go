package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/client"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// logOptions are the flags `task logs` and `service logs` share (those of
// `docker service logs`).
type logOptions struct {
	follow       bool
	tail         uint32
	since, until string
	timestamps   bool
}

func (o *logOptions) register(fs *pflag.FlagSet, followHelp, tailHelp string) {
	fs.BoolVarP(&o.follow, "follow", "f", false, followHelp)
	fs.Uint32Var(&o.tail, "tail", 0, tailHelp)
	fs.StringVar(&o.since, "since", "", "only lines printed since a time (2026-12-07T10:00:00Z, 2026-12-07, Unix seconds) or for a duration (10m)")
	fs.StringVar(&o.until, "until", "", "only lines printed before a time or a duration ago, as --since")
	fs.BoolVarP(&o.timestamps, "timestamps", "t", false, "start each line with the time it was printed")
}

// request is the TaskLogs request for task, times taken against now.
func (o *logOptions) request(task string, now time.Time) (*schedv1.TaskLogsRequest, error) {
	req := &schedv1.TaskLogsRequest{Task: task, Follow: o.follow, Tail: o.tail, Timestamps: o.timestamps}
	var since, until time.Time
	var err error
	if o.since != "" {
		if since, err = parseLogTime(o.since, now); err != nil {
			return nil, fmt.Errorf("--since: %w", err)
		}
		req.Since = timestamppb.New(since)
	}
	if o.until != "" {
		if until, err = parseLogTime(o.until, now); err != nil {
			return nil, fmt.Errorf("--until: %w", err)
		}
		req.Until = timestamppb.New(until)
	}
	if req.Since != nil && req.Until != nil && until.Before(since) {
		return nil, fmt.Errorf("--until %s is before --since %s: no line can be between", o.until, o.since)
	}
	return req, nil
}

// parseLogTime reads a time as `docker logs --since` does: a duration
// before now, RFC 3339 (with or without a zone or seconds; local time
// without a zone), a date, or Unix seconds with an optional fraction.
func parseLogTime(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q: a duration counts back from now, want it positive", s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05.999999999", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	if secs, frac, ok := strings.Cut(s, "."); len(secs) > 0 {
		sec, err1 := strconv.ParseInt(secs, 10, 64)
		var nsec int64
		var err2 error
		if ok {
			if len(frac) == 0 || len(frac) > 9 {
				err2 = errors.New("fraction")
			} else {
				nsec, err2 = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
			}
		}
		if err1 == nil && err2 == nil && sec >= 0 && sec < math.MaxInt64/int64(time.Second) {
			return time.Unix(sec, nsec), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q: want a duration (10m, 1h30m), a time (2026-12-07T10:00:00Z, 2026-12-07T10:00, 2026-12-07) or Unix seconds", s)
}

// streamLogs copies one task's log until the stream ends: its standard
// output to stdout, its standard error to stderr.
func streamLogs(ctx context.Context, c *client.Schedd, req *schedv1.TaskLogsRequest, stdout, stderr io.Writer) error {
	stream, err := c.TaskLogs(ctx, req)
	if err != nil {
		return err
	}
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		w := stdout
		if chunk.GetStderr() {
			w = stderr
		}
		if _, err := w.Write(chunk.GetData()); err != nil {
			return err
		}
	}
}

// prefixWriter prefixes every line with a task's name; the lock, shared
// by the writers of every task and stream, keeps their lines whole.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	bol    bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []byte
	for _, c := range b {
		if p.bol {
			out = append(out, p.prefix...)
		}
		out = append(out, c)
		p.bol = c == '\n'
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}
