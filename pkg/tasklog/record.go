// Package tasklog keeps a task's output as a log of stamped records, as
// `docker logs` and `kubectl logs` users expect of it: each line its
// task printed, with the time it was read and the stream (stdout or
// stderr) it came from, so that a reader can ask for what came since a
// time or print the times; in a file rotated at a size with a bounded
// number of older files, so that a chatty task cannot fill its node's
// disk.
//
// A record is a line of the file in the format the Kubernetes CRI gives
// container logs (what containerd's CRI plugin writes and `crictl logs`
// reads):
//
//	2026-12-07T12:00:00.123456789Z stdout F the line's content
//
// where F marks a record that ends its line and P one of a line too long
// for a record (or the output's last bytes, without a newline): it goes
// on in the stream's next record.
//
// File is the writer (shoal-logger runs it for each task, started by
// containerd's shim, so that logging goes on while schedd restarts);
// Read is the reader (schedd's TaskLogs).
package tasklog

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// The streams of a task's output.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Record is a line, or a piece of one, of a task's output.
type Record struct {
	Time   time.Time
	Stream string
	// Partial: the line goes on in the stream's next record (or the
	// output ended without a newline). Content never holds the newline.
	Partial bool
	Content []byte
}

// TimeLayout is RFC 3339 with nanoseconds, always nine digits, so that
// records sort as text too.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// AppendTo appends r's line, newline included, to b.
func (r Record) AppendTo(b []byte) []byte {
	b = r.Time.UTC().AppendFormat(b, TimeLayout)
	b = append(b, ' ')
	b = append(b, r.Stream...)
	if r.Partial {
		b = append(b, " P "...)
	} else {
		b = append(b, " F "...)
	}
	b = append(b, r.Content...)
	return append(b, '\n')
}

// errMalformed is Parse's error for a line that is not a record.
var errMalformed = errors.New("malformed log record")

// Parse reads a record from line (without its newline). Content shares
// line's memory.
func Parse(line []byte) (Record, error) {
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return Record{}, errMalformed
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return Record{}, fmt.Errorf("%w: %w", errMalformed, err)
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != Stdout && string(stream) != Stderr) {
		return Record{}, errMalformed
	}
	tag, content, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		// A line that was empty, written by a writer that drops the
		// separator after the tag.
		tag, content = rest, nil
	}
	var partial bool
	switch string(tag) {
	case "F":
	case "P":
		partial = true
	default:
		return Record{}, errMalformed
	}
	return Record{Time: t, Stream: string(stream), Partial: partial, Content: content}, nil
}
