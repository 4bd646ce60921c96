package tasklog

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"time"
)

// ReadOptions choose what Read sends.
type ReadOptions struct {
	// Since and Until, when set, keep the records stamped at or after
	// Since and not after Until.
	Since, Until time.Time
	// Tail keeps the last Tail lines (of those Since and Until keep); 0:
	// all.
	Tail int
	// Follow goes on sending records as they are written, across
	// rotations, until ctx ends, Until is passed, or the end of the file
	// is reached after Finished said true.
	Follow   bool
	Finished func() bool
	// Poll is how often a follow looks for new records (default 200 ms).
	Poll time.Duration
	// AtEnd, if set, is called each time a follow has sent every record
	// written so far, before it waits for more (a caller that gathers
	// records sends them then).
	AtEnd func() error
}

// Read sends the records of the log at path (its older files first) to
// emit, in order. A line of the file that is not a record (the file
// written by something else) is sent whole as stdout content, unstamped;
// Since and Until drop such lines.
func Read(ctx context.Context, path string, opt ReadOptions, emit func(Record) error) error {
	if opt.Poll <= 0 {
		opt.Poll = 200 * time.Millisecond
	}
	files, err := openAll(path)
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	out := &sink{opt: opt, emit: emit}
	if opt.Tail > 0 {
		out.tail = []Record{}
	}
	// Every file but the newest is read to its end: nothing is added to
	// a rotated file.
	for len(files) > 1 {
		if err := readToEnd(newLineReader(files[0]), out); err != nil {
			return out.stopped(err)
		}
		files[0].Close()
		files = files[1:]
	}
	var cur *lineReader
	if len(files) == 1 {
		cur = newLineReader(files[0])
		if err := readToEnd(cur, out); err != nil {
			return out.stopped(err)
		}
	}
	if err := out.flushTail(); err != nil {
		return out.stopped(err)
	}
	if !opt.Follow {
		return nil
	}
	ended := false
	for {
		if cur != nil {
			if err := readToEnd(cur, out); err != nil {
				return out.stopped(err)
			}
			// At the end of the file: a rotation moved it away once it
			// is not at path. What was appended before the rename is read
			// first, then the file that came after it.
			if next := successor(path, cur.f); next != nil {
				if err := readToEnd(cur, out); err != nil {
					next.Close()
					return out.stopped(err)
				}
				cur.f.Close()
				cur = newLineReader(next)
				files = []*os.File{next}
				continue
			}
		} else if f, err := os.Open(path); err == nil {
			cur = newLineReader(f)
			files = []*os.File{f}
			continue
		}
		if opt.AtEnd != nil {
			if err := opt.AtEnd(); err != nil {
				return err
			}
		}
		if ended {
			return nil
		}
		if opt.Finished != nil {
			ended = opt.Finished()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(opt.Poll):
		}
	}
}

// successor opens the file written after f once f was rotated away from
// path: the one at the name before f's among the older files, or path
// if f is the newest of them. If f is gone too (more rotations than the
// log keeps happened since the last look), the oldest file kept: the
// files in between are lost to the reader. nil: f is still at path, or
// no file is (a rotation under way).
func successor(path string, f *os.File) *os.File {
	cur, err := f.Stat()
	if err != nil {
		return nil
	}
	if st, err := os.Stat(path); err != nil || os.SameFile(st, cur) {
		return nil
	}
	name := ""
	for n := 1; ; n++ {
		st, err := os.Stat(Rotated(path, n))
		if err != nil {
			break // past the oldest: f was dropped
		}
		if os.SameFile(st, cur) {
			name = path
			if n > 1 {
				name = Rotated(path, n-1)
			}
			break
		}
		name = Rotated(path, n)
	}
	if name == "" {
		name = path
	}
	next, err := os.Open(name)
	if err != nil {
		return nil
	}
	if st, err := next.Stat(); err != nil || os.SameFile(st, cur) {
		next.Close()
		return nil
	}
	return next
}

// errUntil ends a read at the first record past ReadOptions.Until.
var errUntil = errors.New("past until")

// stopped ends a read that met err: one that reached Until sends what
// Tail gathered.
func (s *sink) stopped(err error) error {
	if errors.Is(err, errUntil) {
		return s.flushTail()
	}
	return err
}

// openAll opens the log's files, oldest first. They are opened newest
// first, so that a rotation meanwhile only makes a later name open a
// file already open (skipped) and loses nothing older than the newest.
func openAll(path string) ([]*os.File, error) {
	var files []*os.File
	var infos []os.FileInfo
	for n := 0; ; n++ {
		p := path
		if n > 0 {
			p = Rotated(path, n)
		}
		f, err := os.Open(p)
		if os.IsNotExist(err) {
			if n == 0 {
				continue // between a rotation's rename and its new file
			}
			break
		}
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		st, err := f.Stat()
		dup := err != nil
		for _, o := range infos {
			dup = dup || os.SameFile(o, st)
		}
		if dup {
			f.Close()
			continue
		}
		files, infos = append(files, f), append(infos, st)
	}
	for i, j := 0, len(files)-1; i < j; i, j = i+1, j-1 {
		files[i], files[j] = files[j], files[i]
	}
	return files, nil
}

// lineReader reads a file's lines, keeping an unfinished last one (a
// write in progress) for the next call.
type lineReader struct {
	f       *os.File
	br      *bufio.Reader
	pending []byte
}

func newLineReader(f *os.File) *lineReader {
	return &lineReader{f: f, br: bufio.NewReaderSize(f, 64<<10)}
}

// next returns the next whole line (without its newline), or io.EOF
// at the end of what is written so far.
func (r *lineReader) next() ([]byte, error) {
	for {
		b, err := r.br.ReadSlice('\n')
		switch {
		case err == nil:
			if len(r.pending) > 0 {
				r.pending = append(r.pending, b...)
				line := r.pending[:len(r.pending)-1]
				r.pending = r.pending[:0]
				return line, nil
			}
			return b[:len(b)-1], nil
		case errors.Is(err, bufio.ErrBufferFull), errors.Is(err, io.EOF):
			r.pending = append(r.pending, b...)
			if errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
		default:
			return nil, err
		}
	}
}

func readToEnd(r *lineReader, out *sink) error {
	for {
		line, err := r.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		rec, perr := Parse(line)
		if perr != nil {
			rec = Record{Stream: Stdout, Content: line}
		}
		if err := out.add(rec); err != nil {
			return err
		}
	}
}

// sink applies ReadOptions to the records read, in order.
type sink struct {
	opt  ReadOptions
	emit func(Record) error
	// tail, while not nil, gathers the records Tail may keep: the last
	// Tail+1 lines at most.
	tail  []Record
	lines int
}

func (s *sink) add(rec Record) error {
	if !s.opt.Since.IsZero() && (rec.Time.IsZero() || rec.Time.Before(s.opt.Since)) {
		return nil
	}
	if !s.opt.Until.IsZero() && (rec.Time.IsZero() || rec.Time.After(s.opt.Until)) {
		if rec.Time.IsZero() {
			return nil
		}
		return errUntil
	}
	if s.tail == nil {
		return s.emit(rec)
	}
	// Content shares the reader's buffer.
	rec.Content = append([]byte(nil), rec.Content...)
	s.tail = append(s.tail, rec)
	if !rec.Partial {
		s.lines++
	}
	if s.lines > s.opt.Tail+1 {
		s.dropLine()
	}
	return nil
}

// dropLine drops the oldest line of the gathered tail.
func (s *sink) dropLine() {
	for i, r := range s.tail {
		if !r.Partial {
			s.tail = s.tail[i+1:]
			s.lines--
			return
		}
	}
}

// flushTail sends the last Tail lines gathered (an unfinished last line
// counting as one) and sends later records as they come.
func (s *sink) flushTail() error {
	if s.tail == nil {
		return nil
	}
	keep := s.opt.Tail
	if n := len(s.tail); n > 0 && s.tail[n-1].Partial {
		keep--
	}
	for s.lines > keep {
		s.dropLine()
	}
	for _, r := range s.tail {
		if err := s.emit(r); err != nil {
			return err
		}
	}
	s.tail = nil
	return nil
}
