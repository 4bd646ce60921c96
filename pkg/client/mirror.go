package client

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Mirror keeps a local copy of the documents under some prefixes of
// statd's state, with per-field stamps (statepb.FromDocument), for daemons that reconcile against it (schedd, netd,
// vold). It lists each prefix, then follows the change stream from the
// list's revision, so it never misses a change; when statd restarts or the
// change log no longer reaches back far enough, it lists again.
type Mirror struct {
	c        *Statd
	prefixes []string
	log      *slog.Logger

	mu     sync.RWMutex
	docs   map[string]*statev1.Document
	listed map[string]bool // prefixes listed at least once
	// deleted holds keys this mirror saw deleted by a watch event (not
	// those already gone at its first listing).
	deleted map[string]bool
	subs    []chan struct{}
}

// NewMirror returns a mirror of prefixes; Run fills it.
func NewMirror(c *Statd, log *slog.Logger, prefixes ...string) *Mirror {
	return &Mirror{c: c, prefixes: prefixes, log: log, docs: map[string]*statev1.Document{}, listed: map[string]bool{}, deleted: map[string]bool{}}
}

// Run keeps the mirror current until ctx ends.
func (m *Mirror) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, p := range m.prefixes {
		wg.Add(1)
		go func() { defer wg.Done(); m.follow(ctx, p) }()
	}
	wg.Wait()
	return nil
}

func (m *Mirror) follow(ctx context.Context, prefix string) {
	failures := 0
	for ctx.Err() == nil {
		rev, err := m.list(ctx, prefix)
		if err == nil {
			m.markReady(prefix)
			err = m.c.WatchMeta(ctx, prefix, rev, func(resp *statev1.WatchResponse) error {
				if len(resp.GetEvents()) == 0 {
					return nil
				}
				m.mu.Lock()
				for _, e := range resp.GetEvents() {
					key := e.GetDocument().GetKey()
					if e.GetType() == statev1.Event_TYPE_DELETE {
						delete(m.docs, key)
						m.deleted[key] = true
					} else {
						m.docs[key] = e.GetDocument()
						delete(m.deleted, key)
					}
				}
				m.mu.Unlock()
				m.notify()
				return nil
			})
		}
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) != codes.FailedPrecondition {
			m.log.Warn("state mirror: relisting", "prefix", prefix, "err", err)
		}
		failures++
		select {
		case <-ctx.Done():
		case <-time.After(m.c.retry.Backoff(failures)):
		}
	}
}

// list replaces the mirror's documents under prefix with a fresh listing
// and returns its revision.
func (m *Mirror) list(ctx context.Context, prefix string) (uint64, error) {
	fresh := map[string]*statev1.Document{}
	token := ""
	var rev uint64
	for {
		resp, err := m.c.List(ctx, &statev1.ListRequest{Prefix: prefix, PageToken: token, PageSize: 1000, WithMeta: true})
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.GetRevision()
		}
		for _, d := range resp.GetDocuments() {
			fresh[d.GetKey()] = d
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	m.mu.Lock()
	for k := range m.docs {
		if strings.HasPrefix(k, prefix) {
			delete(m.docs, k)
		}
	}
	for k, d := range fresh {
		m.docs[k] = d
	}
	m.mu.Unlock()
	m.notify()
	return rev, nil
}

func (m *Mirror) markReady(prefix string) {
	m.mu.Lock()
	m.listed[prefix] = true
	m.mu.Unlock()
}

// Ready reports whether every prefix has been listed at least once.
func (m *Mirror) Ready() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.listed) == len(m.prefixes)
}

// Deleted reports whether the mirror saw key deleted (and not written
// again since).
func (m *Mirror) Deleted(key string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.deleted[key]
}

// Get returns the document at key, nil if absent.
func (m *Mirror) Get(key string) *statev1.Document {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.docs[key]
}

// List returns the documents under prefix (in no particular order).
func (m *Mirror) List(prefix string) []*statev1.Document {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []*statev1.Document
	for k, d := range m.docs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, d)
		}
	}
	return out
}

// Changes returns a channel that receives a value (coalesced) after every
// change to the mirror.
func (m *Mirror) Changes() <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.subs = append(m.subs, ch)
	m.mu.Unlock()
	return ch
}

func (m *Mirror) notify() {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, ch := range m.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
