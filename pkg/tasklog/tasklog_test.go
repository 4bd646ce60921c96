package tasklog

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseCRI(t *testing.T) {
	// As containerd's CRI plugin writes them.
	rec, err := Parse([]byte("2016-10-06T00:17:09.669794202Z stdout P log content 1"))
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2016, 10, 6, 0, 17, 9, 669794202, time.UTC)
	if !rec.Time.Equal(want) || rec.Stream != Stdout || !rec.Partial || string(rec.Content) != "log content 1" {
		t.Fatalf("got %+v", rec)
	}
	rec, err = Parse([]byte("2016-10-06T00:17:10.113242941+02:00 stderr F "))
	if err != nil || rec.Stream != Stderr || rec.Partial || len(rec.Content) != 0 {
		t.Fatalf("got %+v, %v", rec, err)
	}
	for _, bad := range []string{"", "hello world", "2016-10-06T00:17:09Z stdin F x", "2016-10-06T00:17:09Z stdout X x", "yesterday stdout F x", "2016-10-06T00:17:09Z stdout"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted it", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(int64(1765100000123456789), true, []byte("hello"))
	f.Add(int64(0), false, []byte(""))
	f.Add(int64(-5), false, []byte(" F x "))
	f.Fuzz(func(t *testing.T, nanos int64, partial bool, content []byte) {
		content = bytes.ReplaceAll(content, []byte{'\n'}, nil)
		in := Record{Time: time.Unix(0, nanos), Stream: Stderr, Partial: partial, Content: content}
		line := in.AppendTo(nil)
		if bytes.Count(line, []byte{'\n'}) != 1 || line[len(line)-1] != '\n' {
			t.Fatalf("%q is not one line", line)
		}
		out, err := Parse(line[:len(line)-1])
		if err != nil {
			t.Fatalf("Parse(%q): %v", line, err)
		}
		if !out.Time.Equal(in.Time) || out.Stream != in.Stream || out.Partial != in.Partial || !bytes.Equal(out.Content, in.Content) {
			t.Fatalf("round trip of %+v gave %+v", in, out)
		}
		Parse(content) // never panics
	})
}

// clock stamps records one millisecond apart from a fixed start.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

func readAll(t *testing.T, path string, opt ReadOptions) []Record {
	t.Helper()
	var got []Record
	err := Read(context.Background(), path, opt, func(r Record) error {
		r.Content = append([]byte(nil), r.Content...)
		got = append(got, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// text is what a reader of the records prints without times.
func text(recs []Record) string {
	var b strings.Builder
	for _, r := range recs {
		b.Write(r.Content)
		if !r.Partial {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func TestCopySplitsLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.log")
	l, err := Create(path, DefaultLimits, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", MaxLine+10)
	in := "one\n\ntwo words\n" + long + "\nno newline at the end"
	if err := l.Copy(Stderr, strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	got := readAll(t, path, ReadOptions{})
	if text(got) != in {
		t.Fatalf("read back %q…, want the output as written", text(got)[:40])
	}
	var tags []string
	for _, r := range got {
		if r.Stream != Stderr {
			t.Errorf("record %+v is not stderr's", r)
		}
		tags = append(tags, fmt.Sprintf("%v:%d", r.Partial, len(r.Content)))
	}
	want := []string{"false:3", "false:0", "false:9", fmt.Sprintf("true:%d", MaxLine), "false:10", "true:21"}
	if fmt.Sprint(tags) != fmt.Sprint(want) {
		t.Fatalf("records (partial:length) %v, want %v", tags, want)
	}
}

func TestRotationKeepsTheNewestWithinLimits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.log")
	limits := Limits{MaxSize: 4096, MaxFiles: 3}
	l, err := Create(path, limits, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range 1000 { // about 50 KiB of records: rotated a dozen times
		fmt.Fprintf(&in, "line %04d\n", i)
	}
	if err := l.Copy(Stdout, strings.NewReader(in.String())); err != nil {
		t.Fatal(err)
	}
	l.Close()
	entries, _ := os.ReadDir(dir)
	var total int64
	for _, e := range entries {
		info, _ := e.Info()
		total += info.Size()
	}
	if len(entries) != 3 || total > limits.MaxSize*int64(limits.MaxFiles)+100 {
		t.Fatalf("%d files of %d bytes, want 3 of at most about %d", len(entries), total, limits.MaxSize*3)
	}
	got := text(readAll(t, path, ReadOptions{}))
	if !strings.HasSuffix(in.String(), got) || !strings.HasSuffix(got, "line 0999\n") || !strings.HasPrefix(got, "line ") {
		t.Fatalf("read back %d bytes that are not the end of the output", len(got))
	}
	if n := strings.Count(got, "\n"); n < 150 || n > 250 {
		t.Fatalf("%d lines kept in 3 files of 4 KiB, want about 12 KiB's worth", n)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left %v", entries)
	}
}

func TestReadSinceUntilTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.log")
	c := newClock()
	l, err := Create(path, Limits{MaxSize: 4096, MaxFiles: 10}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range 400 { // rotated a few times: reads go across files
		fmt.Fprintf(&in, "line %03d\n", i)
	}
	in.WriteString("unfinished")
	l.Copy(Stdout, strings.NewReader(in.String()))
	l.Close()
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return start.Add(time.Duration(i+1) * time.Millisecond) }
	lines := func(from, to int) string {
		var b strings.Builder
		for i := from; i < to; i++ {
			fmt.Fprintf(&b, "line %03d\n", i)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name string
		opt  ReadOptions
		want string
	}{
		{"all", ReadOptions{}, in.String()},
		{"since", ReadOptions{Since: at(395)}, lines(395, 400) + "unfinished"},
		{"until", ReadOptions{Until: at(2)}, lines(0, 3)},
		{"since and until", ReadOptions{Since: at(100), Until: at(101)}, lines(100, 102)},
		{"tail", ReadOptions{Tail: 3}, lines(398, 400) + "unfinished"},
		{"tail of a window", ReadOptions{Until: at(250), Tail: 2}, lines(249, 251)},
		{"tail beyond", ReadOptions{Since: at(398), Tail: 50}, lines(398, 400) + "unfinished"},
	} {
		if got := text(readAll(t, path, tc.opt)); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestFollowAcrossRotations writes while a follower reads: every line
// reaches it once and in order though the file is rotated under it.
func TestFollowAcrossRotations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.log")
	// A burst of 100 lines rotates the file up to twice: the file the
	// follower reads is then the second older one, which three files keep.
	l, err := Create(path, Limits{MaxSize: 4096, MaxFiles: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	var finished sync.WaitGroup
	finished.Add(1)
	done := make(chan struct{})
	go func() {
		defer finished.Done()
		l.Copy(Stdout, pr)
		close(done)
	}()
	var got strings.Builder
	readErr := make(chan error, 1)
	go func() {
		readErr <- Read(context.Background(), path, ReadOptions{Follow: true, Poll: time.Millisecond, Finished: func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		}}, func(r Record) error {
			got.Write(r.Content)
			got.WriteByte('\n')
			return nil
		})
	}()
	var want strings.Builder
	for i := range 2000 { // 24 rotations; a pause every 100 lines lets the follower catch up
		line := fmt.Sprintf("line %04d\n", i)
		want.WriteString(line)
		io.WriteString(pw, line)
		if i%100 == 99 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	pw.Close()
	finished.Wait()
	select {
	case err := <-readErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follow did not end after the writer finished")
	}
	l.Close()
	if got.String() != want.String() {
		g, w := strings.Split(got.String(), "\n"), strings.Split(want.String(), "\n")
		t.Fatalf("followed %d lines (first %q, last %q), want %d", len(g)-1, g[0], g[max(0, len(g)-2)], len(w)-1)
	}
}

func TestReadRawLines(t *testing.T) {
	// A log written before records (the shim appending the output as is).
	path := filepath.Join(t.TempDir(), "t.log")
	os.WriteFile(path, []byte("plain\n2026-12-07T12:00:00.000000001Z stdout F stamped\nlast"), 0o600)
	if got := text(readAll(t, path, ReadOptions{})); got != "plain\nstamped\n" {
		t.Fatalf("got %q", got)
	}
	if got := text(readAll(t, path, ReadOptions{Since: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})); got != "stamped\n" {
		t.Fatalf("since: got %q", got)
	}
}

func TestLimitsCheck(t *testing.T) {
	for _, l := range []Limits{{MaxSize: 100, MaxFiles: 1}, {MaxSize: 1 << 20, MaxFiles: 0}, {MaxSize: 1 << 20, MaxFiles: 101}} {
		if l.Check() == nil {
			t.Errorf("%+v accepted", l)
		}
	}
	if err := DefaultLimits.Check(); err != nil {
		t.Fatal(err)
	}
}
