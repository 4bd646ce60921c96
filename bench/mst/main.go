// Command mst measures pkg/mst: bulk and incremental insert, the cost of
// re-rooting after one change, memory after a full scan, and the bytes
// anti-entropy fetches for a given difference. It prints a Markdown section
// on stdout (docs/BENCHMARKS.md style: absolute figures plus a baseline
// measured in the same run).
//
// Stores are in-memory (mst.MemStore): the figures are the tree's CPU and
// memory cost, not Pebble's.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/mst"
)

func main() {
	sizes := flag.String("sizes", "100000,1000000", "tree sizes for the insert table")
	batch := flag.Int("batch", 1000, "Puts per Commit in the one-by-one insert")
	reps := flag.Int("reps", 3, "repetitions of each insert timing (sizes above 300k run once)")
	rootRuns := flag.Int("root-runs", 101, "single-change commits timed on the largest tree")
	diffN := flag.Int("diff-keys", 100000, "tree size for the diff table")
	diffD := flag.String("diff-d", "1,100,1000", "numbers of changed keys for the diff table")
	trials := flag.Int("trials", 5, "random trees per diff case")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()

	b := &bench{rng: rand.New(rand.NewPCG(*seed, 0x5eed))}
	fmt.Printf("## Merkle Search Tree (pkg/mst)\n\n")
	fmt.Printf("Machine: %d CPUs, %s/%s, %s. Keys and values are 32 random bytes; stores are in memory (mst.MemStore).\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	ns := parseInts(*sizes)
	var big *loaded
	b.insertTable(ns, *batch, *reps, func(l *loaded) { big = l })
	if big != nil {
		b.rootTable(big, *rootRuns)
		b.memoryTable(big)
	}
	b.diffTable(*diffN, parseInts(*diffD), *trials)
}

type bench struct{ rng *rand.Rand }

// loaded is the largest tree of the insert table, reused by later tables.
type loaded struct {
	entries []mst.Entry
	store   *mst.MemStore
	root    mst.Hash
}

func (b *bench) entries(n int) []mst.Entry {
	buf := make([]byte, 64*n)
	for i := 0; i < len(buf); i += 8 {
		v := b.rng.Uint64()
		for j := range 8 {
			buf[i+j] = byte(v >> (8 * j))
		}
	}
	es := make([]mst.Entry, n)
	for i := range es {
		es[i] = mst.Entry{Key: buf[64*i : 64*i+32 : 64*i+32], Value: buf[64*i+32 : 64*i+64 : 64*i+64]}
	}
	slices.SortFunc(es, func(x, y mst.Entry) int { return bytes.Compare(x.Key, y.Key) })
	return es
}

func (b *bench) insertTable(sizes []int, batch, reps int, keep func(*loaded)) {
	fmt.Printf("### Insert\n\n")
	fmt.Printf("Build is the bulk load from sorted entries (rebuild after corruption). One-by-one is Put in random order with a Commit (and store Apply) every %d Puts. Baseline: inserting the same entries into a Go `map[[32]byte][32]byte`. Times are the median of the runs, range in brackets.\n\n", batch)
	fmt.Printf("| keys | runs | Build | Build keys/s | one-by-one | one-by-one keys/s | map baseline | Build ÷ map | one-by-one ÷ map | nodes | store MiB |\n")
	fmt.Printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range sizes {
		es := b.entries(n)
		r := reps
		if n > 300000 {
			r = 1
		}
		var tBuild, tPut, tMap []time.Duration
		var last *loaded
		for range r {
			runtime.GC()
			start := time.Now()
			c, err := mst.Build(mst.Entries(es), mst.Options{})
			check(err)
			tBuild = append(tBuild, time.Since(start))

			store := mst.NewMemStore()
			order := b.rng.Perm(n)
			runtime.GC()
			start = time.Now()
			tr := mst.Open(store, mst.Hash{}, mst.Options{})
			for i, j := range order {
				check(tr.Put(es[j].Key, es[j].Value))
				if (i+1)%batch == 0 || i == n-1 {
					ch, err := tr.Commit()
					check(err)
					store.Apply(ch)
				}
			}
			tPut = append(tPut, time.Since(start))
			if tr.Committed() != c.Root {
				fail("one-by-one root %s differs from Build root %s", tr.Committed(), c.Root)
			}
			last = &loaded{entries: es, store: store, root: c.Root}

			runtime.GC()
			start = time.Now()
			m := make(map[[32]byte][32]byte)
			for _, j := range order {
				m[[32]byte(es[j].Key)] = [32]byte(es[j].Value)
			}
			tMap = append(tMap, time.Since(start))
		}
		fmt.Printf("| %d | %d | %s | %s | %s | %s | %s | %.1f× | %.1f× | %d | %.1f |\n",
			n, r, durs(tBuild), rate(n, median(tBuild)), durs(tPut), rate(n, median(tPut)), durs(tMap),
			ratio(median(tBuild), median(tMap)), ratio(median(tPut), median(tMap)),
			last.store.Len(), float64(last.store.Bytes())/(1<<20))
		keep(last)
	}
	fmt.Println()
}

func (b *bench) rootTable(l *loaded, runs int) {
	n := len(l.entries)
	tr := mst.Open(l.store, l.root, mst.Options{})
	// Warm the cache the way a running statd would have: a few hundred
	// random reads.
	for range 1000 {
		_, _, err := tr.Get(l.entries[b.rng.IntN(n)].Key)
		check(err)
	}
	var tRoot, tCommit []time.Duration
	var added, removed int
	for range runs {
		e := l.entries[b.rng.IntN(n)]
		v := make([]byte, 32)
		for i := range v {
			v[i] = byte(b.rng.Uint32())
		}
		start := time.Now()
		check(tr.Put(e.Key, v))
		_, err := tr.Root()
		check(err)
		tRoot = append(tRoot, time.Since(start))
		start = time.Now()
		ch, err := tr.Commit()
		check(err)
		l.store.Apply(ch)
		tCommit = append(tCommit, tRoot[len(tRoot)-1]+time.Since(start))
		added += len(ch.Added)
		removed += len(ch.Removed)
		// Restore the entry, so the tree stays the one of l.entries.
		check(tr.Put(e.Key, e.Value))
		ch, err = tr.Commit()
		check(err)
		l.store.Apply(ch)
	}
	if tr.Committed() != l.root {
		fail("root changed after restoring every entry")
	}
	fmt.Printf("### One change on the %d-key tree\n\n", n)
	fmt.Printf("Put of a new value for a random existing key, then Root (re-hash of the dirty path) or Commit (Root plus collecting the Changes and applying them to the store), over %d runs with the default cache (%d nodes) warmed by 1000 random Gets. Each Commit added %.1f and removed %.1f nodes on average.\n\n",
		runs, mst.DefaultCacheNodes, float64(added)/float64(runs), float64(removed)/float64(runs))
	fmt.Printf("| operation | median | p90 | min | max |\n|---|---:|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{{"Put + Root", tRoot}, {"Put + Commit + Apply", tCommit}} {
		s := slices.Clone(row.ds)
		slices.Sort(s)
		fmt.Printf("| %s | %s | %s | %s | %s |\n", row.name, dur(median(s)), dur(s[len(s)*9/10]), dur(s[0]), dur(s[len(s)-1]))
	}
	fmt.Println()
}

func (b *bench) memoryTable(l *loaded) {
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	fmt.Printf("### Memory of a %d-key tree\n\n", len(l.entries))
	fmt.Printf("Heap retained by an open Tree (its cache) after an Ascend over every key and 10000 random Gets, excluding the store (which statd keeps in Pebble). A decoded node costs about 180 B per key; random reads land on nodes in proportion to their size, so a cache filled by them holds larger nodes than one filled by a scan (the smaller caches here end on random reads).\n\n")
	fmt.Printf("| CacheNodes | nodes cached | heap retained MiB | bytes per cached node |\n|---:|---:|---:|---:|\n")
	for _, c := range []int{4096, mst.DefaultCacheNodes, 65536} {
		before := heap()
		tr := mst.Open(l.store, l.root, mst.Options{CacheNodes: c})
		count := 0
		check(tr.Ascend(nil, func(_, _ []byte) bool { count++; return true }))
		if count != len(l.entries) {
			fail("Ascend saw %d keys, want %d", count, len(l.entries))
		}
		for range 10000 {
			_, _, err := tr.Get(l.entries[b.rng.IntN(len(l.entries))].Key)
			check(err)
		}
		after := heap()
		cached := tr.CachedNodes()
		retained := int64(after) - int64(before)
		fmt.Printf("| %d | %d | %.1f | %d |\n", c, cached, float64(retained)/(1<<20), retained/int64(max(cached, 1)))
		runtime.KeepAlive(tr)
	}
	fmt.Println()
}

func (b *bench) diffTable(n int, ds []int, trials int) {
	const entrySize = 64
	fmt.Printf("### Anti-entropy: one Pull between %d-key trees differing in d values\n\n", n)
	fmt.Printf("Replica B changes the values of d keys of replica A, either scattered (d random keys) or clustered (d consecutive keys in key order); A pulls from B. Median over %d random trees, range in brackets. The floor is d × 64 B: it counts only each differing key and its 32-byte digest, not the documents synced afterwards. Round trips are fetch calls (one per tree level below a differing root). A two-way sync also pulls B ← A, at about the same cost.\n\n", trials)
	fmt.Printf("| fanout | d | layout | nodes fetched | KiB fetched | round trips | entries compared | ÷ floor |\n")
	fmt.Printf("|---:|---:|---|---:|---:|---:|---:|---:|\n")
	ctx := context.Background()
	for _, lb := range []int{4, 2} {
		opts := mst.Options{LevelBits: lb}
		type acc struct{ nodes, kib, trips, compared, ratio []float64 }
		results := make(map[string]*acc)
		var treeNodes, treeBytes []float64
		for range trials {
			es := b.entries(n)
			c, err := mst.Build(mst.Entries(es), opts)
			check(err)
			base := mst.NewMemStore()
			base.Apply(c)
			treeNodes = append(treeNodes, float64(base.Len()))
			treeBytes = append(treeBytes, float64(base.Bytes()))
			for _, d := range ds {
				for _, layout := range []string{"scattered", "clustered"} {
					var idx []int
					if layout == "scattered" {
						idx = b.rng.Perm(n)[:d]
					} else {
						start := b.rng.IntN(n - d + 1)
						for i := range d {
							idx = append(idx, start+i)
						}
					}
					remote := base.Clone()
					tb := mst.Open(remote, c.Root, opts)
					for _, i := range idx {
						v := bytes.Clone(es[i].Value)
						v[0] ^= 0xff
						check(tb.Put(es[i].Key, v))
					}
					cb, err := tb.Commit()
					check(err)
					remote.Apply(cb)
					ta := mst.Open(base, c.Root, opts)
					got, st, err := mst.Pull(ctx, ta, base.Has, cb.Root, remote.Fetch)
					check(err)
					if len(got) != d {
						fail("Pull returned %d entries for d=%d", len(got), d)
					}
					key := fmt.Sprintf("%d/%s", d, layout)
					a := results[key]
					if a == nil {
						a = new(acc)
						results[key] = a
					}
					a.nodes = append(a.nodes, float64(st.NodesFetched))
					a.kib = append(a.kib, float64(st.BytesFetched)/1024)
					a.trips = append(a.trips, float64(st.RoundTrips))
					a.compared = append(a.compared, float64(st.EntriesCompared))
					a.ratio = append(a.ratio, float64(st.BytesFetched)/float64(d*entrySize))
				}
			}
		}
		for _, d := range ds {
			for _, layout := range []string{"scattered", "clustered"} {
				a := results[fmt.Sprintf("%d/%s", d, layout)]
				fmt.Printf("| %d | %d | %s | %s | %s | %s | %s | %s× |\n", 1<<lb, d, layout,
					spread(a.nodes, "%.0f"), spread(a.kib, "%.1f"), spread(a.trips, "%.0f"), spread(a.compared, "%.0f"), spread(a.ratio, "%.1f"))
			}
		}
		fmt.Printf("| %d | whole tree | | %s | %s | | | |\n", 1<<lb, spread(treeNodes, "%.0f"), spread(scale(treeBytes, 1.0/1024), "%.0f"))
	}
	fmt.Println()
}

func scale(xs []float64, f float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * f
	}
	return out
}

// spread formats the median of xs and, if they differ, their range.
func spread(xs []float64, format string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	out := fmt.Sprintf(format, med)
	if s[0] != s[len(s)-1] {
		out += " [" + fmt.Sprintf(format, s[0]) + "–" + fmt.Sprintf(format, s[len(s)-1]) + "]"
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func durs(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	out := dur(s[len(s)/2])
	if len(s) > 1 {
		out += " [" + dur(s[0]) + "–" + dur(s[len(s)-1]) + "]"
	}
	return out
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	}
}

func rate(n int, d time.Duration) string {
	return fmt.Sprintf("%.0fk", float64(n)/d.Seconds()/1000)
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func parseInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		check(err)
		out = append(out, n)
	}
	return out
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mst bench: "+format+"\n", args...)
	os.Exit(1)
}
