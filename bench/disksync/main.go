// Command disksync measures a disk's synchronous small writes as a
// replicated log makes them: each writer appends 4.5 KiB records to a
// preallocated file of its own, each record written and fdatasynced
// before the next. It reports, per writer, the sync rate and latency and
// the share of the time spent in syncs over 2 ms, with when in each
// 100 ms of the clock those slow syncs began (10 ms bins): on this
// project's VMs several writers at once meet a stall of several
// milliseconds every 100 ms that one writer alone rarely meets
// (docs/VOLUMES-PERFORMANCE.md). With -serial the writers take turns, so
// that the disk never has two flushes at once. It writes only under -dir
// and removes what it wrote.
//
//	go run ./bench/disksync -writers 1,2,3
//	go run ./bench/disksync -writers 2,3 -serial
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	recordSize = 4500
	fileSize   = 64 << 20
	slow       = 2 * time.Millisecond
)

type result struct {
	lat   []time.Duration
	el    time.Duration
	slowT time.Duration
	bins  [10]int
	err   error
}

func main() {
	dir := flag.String("dir", "/var/tmp", "directory for the writers' files (on the disk to measure)")
	writers := flag.String("writers", "1,2,3", "writer counts to measure, comma-separated")
	d := flag.Duration("duration", 5*time.Second, "length of each measurement")
	serial := flag.Bool("serial", false, "writers take turns: one write and sync at a time (the disk never sees two flushes at once)")
	flag.Parse()
	for _, w := range strings.Split(*writers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "disksync: bad writer count %q\n", w)
			os.Exit(2)
		}
		if err := measure(*dir, n, *d, *serial); err != nil {
			fmt.Fprintf(os.Stderr, "disksync: %v\n", err)
			os.Exit(1)
		}
	}
}

// measure runs n writers at once, each on a file of its own.
func measure(dir string, n int, d time.Duration, serial bool) error {
	var turn sync.Mutex
	files := make([]*os.File, n)
	for i := range files {
		f, err := prepare(filepath.Join(dir, fmt.Sprintf("disksync-%d-%d", os.Getpid(), i)))
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		defer f.Close()
		files[i] = f
	}
	res := make([]result, n)
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var t *sync.Mutex
			if serial {
				t = &turn
			}
			res[i] = write(f, d, t)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.err != nil {
			return r.err
		}
		slices.Sort(r.lat)
		fmt.Printf("%d writer(s), writer %d: %.0f syncs/s, p50 %v, p99 %v, max %v; %.1f%% of the time in syncs over %v; their starts (ms within each 100 ms, 10 ms bins) %v\n",
			n, i+1, float64(len(r.lat))/r.el.Seconds(), r.lat[len(r.lat)/2].Round(time.Microsecond), r.lat[len(r.lat)*99/100].Round(time.Microsecond),
			r.lat[len(r.lat)-1].Round(time.Microsecond), 100*r.slowT.Seconds()/r.el.Seconds(), slow, r.bins)
	}
	return nil
}

// prepare creates a file of fileSize bytes, written and synced, so that
// the measured writes overwrite allocated blocks (as vold's journal does).
func prepare(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	zero := make([]byte, 1<<20)
	for off := 0; off < fileSize; off += len(zero) {
		if _, err := f.Write(zero); err != nil {
			f.Close()
			os.Remove(path)
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return f, nil
}

// write appends records to f for d; with turn, each write and sync is
// made holding it.
func write(f *os.File, d time.Duration, turn *sync.Mutex) result {
	var r result
	rec := make([]byte, recordSize)
	start := time.Now()
	for off := int64(0); time.Since(start) < d; off = (off + recordSize) % (fileSize - recordSize) {
		s, l, err := appendSynced(f, rec, off, turn)
		if err != nil {
			r.err = err
			return r
		}
		r.lat = append(r.lat, l)
		if l > slow {
			r.slowT += l
			r.bins[s.Nanosecond()/1e6%100/10]++
		}
	}
	r.el = time.Since(start)
	return r
}

// appendSynced writes rec at off and syncs f, holding turn if not nil,
// and returns when the write began and how long it and the sync took.
func appendSynced(f *os.File, rec []byte, off int64, turn *sync.Mutex) (time.Time, time.Duration, error) {
	if turn != nil {
		turn.Lock()
		defer turn.Unlock()
	}
	s := time.Now()
	if _, err := unix.Pwrite(int(f.Fd()), rec, off); err != nil {
		return s, 0, err
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return s, 0, err
	}
	return s, time.Since(s), nil
}
