package tasklog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxLine is the most of a line one record holds; a longer line is
// split into partial records (as containerd's CRI plugin does, at 16 KiB).
const MaxLine = 16 << 10

// Limits bound a task's log on disk: the file is rotated once it holds
// MaxSize bytes, and MaxFiles files are kept, the current one included
// (so at most about MaxSize × MaxFiles bytes).
type Limits struct {
	MaxSize  int64
	MaxFiles int
}

// DefaultLimits are those of the kubelet's container logs.
var DefaultLimits = Limits{MaxSize: 10 << 20, MaxFiles: 5}

// Check reports limits that cannot be kept.
func (l Limits) Check() error {
	if l.MaxSize < 4096 {
		return fmt.Errorf("log max size %d: want at least 4096 bytes", l.MaxSize)
	}
	if l.MaxFiles < 1 || l.MaxFiles > 100 {
		return fmt.Errorf("log max files %d: want 1 to 100", l.MaxFiles)
	}
	return nil
}

// Rotated is the name of path's n-th older file (1 is the newest).
func Rotated(path string, n int) string { return path + "." + strconv.Itoa(n) }

// File appends records to a log file, rotating it as its Limits say.
// Its methods may be called from several goroutines (a task's stdout and
// stderr).
type File struct {
	path   string
	limits Limits
	now    func() time.Time

	mu   sync.Mutex
	f    *os.File
	size int64
	buf  []byte
}

// Create opens path for appending (creating it), its records stamped
// with now (time.Now if nil).
func Create(path string, limits Limits, now func() time.Time) (*File, error) {
	if err := limits.Check(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	l := &File{path: path, limits: limits, now: now}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *File) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Copy writes r's lines as records of stream until r ends, and returns
// nil then: write errors (a full disk) lose records but never stop the
// copy, since the task would block on a full pipe. Only r's errors are
// returned.
func (l *File) Copy(stream string, r io.Reader) error {
	br := bufio.NewReaderSize(r, MaxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			full := line[len(line)-1] == '\n'
			if full {
				line = line[:len(line)-1]
			}
			l.write(Record{Time: l.now(), Stream: stream, Partial: !full, Content: line})
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return nil
		default:
			return err
		}
	}
}

// write appends rec with one write call (so that a reader never sees
// half of a record but at the end of the file) and rotates the file once
// it is full.
func (l *File) write(rec Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		// The last rotation could not open a new file: try again.
		if err := l.open(); err != nil {
			return
		}
	}
	l.buf = rec.AppendTo(l.buf[:0])
	n, _ := l.f.Write(l.buf) // a record lost; the next may fit
	l.size += int64(n)
	if l.size >= l.limits.MaxSize {
		l.rotate()
	}
}

// rotate renames the file to its first older name, shifting the older
// ones and dropping the oldest, and starts a new one. A reader that has
// the file open reads it to its end and then opens the new one (Read).
func (l *File) rotate() {
	l.f.Close()
	l.f = nil
	keep := l.limits.MaxFiles - 1
	if keep == 0 {
		os.Remove(l.path)
	} else {
		os.Remove(Rotated(l.path, keep))
		for n := keep - 1; n >= 1; n-- {
			os.Rename(Rotated(l.path, n), Rotated(l.path, n+1))
		}
		os.Rename(l.path, Rotated(l.path, 1))
	}
	if err := l.open(); err != nil {
		l.f = nil
	}
}

// Close closes the file.
func (l *File) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Remove removes the log at path and its older files.
func Remove(path string) error {
	older, err := filepath.Glob(globEscape(path) + ".[0-9]*")
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range append(older, path) {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// globEscape quotes path's glob metacharacters.
func globEscape(path string) string {
	var b strings.Builder
	for _, c := range path {
		if strings.ContainsRune(`*?[\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}
