package vold

import (
	"context"
	"encoding/binary"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/volfs"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// Whether a node's vold answers. statd's membership says a node is alive,
// not that its vold runs: vold may have crashed for good, or not be able
// to start there, while statd goes on. Replicas placed on such a node
// would be missing from the moment they are placed, and the repair that
// replaces a silent vold's replicas (repair.go) only hears of the nodes
// it shares groups with. So before a replica is placed the chosen nodes
// are asked over VolPeer (kindPing), and those that do not answer are
// passed over.

// kindPing asks a vold whether it is ready to host replicas: it answers
// once its Raft host's loop has synced a journal record
// (raftgroup.Host.Check), so a stuck loop or disk does not answer. The
// answer's payload is the volume level the vold lets volumes reach
// (level.go), as a uvarint; a vold from before levels answers with none.
const kindPing = "ping"

const (
	// probeTimeout bounds one ping: a vold that is running answers in
	// milliseconds (a round and a sync), one that is not refuses the
	// connection at once.
	probeTimeout = 2 * time.Second
	// probeTTL is how long an answer is remembered, so that a repair round
	// over many groups or a burst of creates asks each node once.
	probeTTL = 5 * time.Second
)

type probeResult struct {
	at time.Time
	// level is the volume level the vold answered with, 0 when it did not
	// answer.
	level uint32
}

// probes remembers recent pings' outcomes.
type probes struct {
	mu   sync.Mutex
	last map[string]probeResult
}

// answering pings those of nodes without a recent outcome, at once, and
// reports which of nodes answered. This node's own vold answers.
func (n *node) answering(ctx context.Context, nodes []string) map[string]bool {
	return n.answeringAt(ctx, nodes, 1)
}

// answeringAt reports which of nodes answered a ping with at least level
// (answering).
func (n *node) answeringAt(ctx context.Context, nodes []string, level uint32) map[string]bool {
	out := map[string]bool{}
	for id, l := range n.pingedLevels(ctx, nodes, false) {
		out[id] = l >= max(level, 1)
	}
	return out
}

// pingedLevels pings those of nodes without a recent outcome, at once,
// and returns the level each answered with (0: it did not answer). This
// node's own vold answers with its level. With fresh, every node is
// asked again: a level remembered from before the node's vold was
// replaced by another would be wrong for up to probeTTL, and a silence
// remembered from its restart would hold a raise back as long.
func (n *node) pingedLevels(ctx context.Context, nodes []string, fresh bool) map[string]uint32 {
	out := map[string]uint32{}
	var ask []string
	now := time.Now()
	n.probes.mu.Lock()
	for _, id := range nodes {
		if id == n.id {
			out[id] = n.level()
			continue
		}
		if r, ok := n.probes.last[id]; ok && now.Sub(r.at) < probeTTL && !fresh {
			out[id] = r.level
			continue
		}
		ask = append(ask, id)
	}
	n.probes.mu.Unlock()
	if len(ask) == 0 {
		return out
	}
	asked := askEach(ask, func(id string) (uint32, bool) { return n.ping(ctx, id), true })
	maps.Copy(out, asked)
	if ctx.Err() != nil {
		return out // a cancelled caller learnt nothing about the nodes
	}
	n.probes.mu.Lock()
	defer n.probes.mu.Unlock()
	if n.probes.last == nil {
		n.probes.last = map[string]probeResult{}
	}
	for id, l := range asked {
		prev, known := n.probes.last[id]
		n.probes.last[id] = probeResult{at: now, level: l}
		// Said once when a vold stops answering, not on every ping.
		if l == 0 && (!known || prev.level > 0) {
			n.log.Info("vold does not answer a ping; new replicas go elsewhere while another node can take them", "peer_node", id)
		}
	}
	return out
}

// ping asks node's vold whether it is ready and returns the volume level
// it answered with, or 0 when it is unreachable or not ready. Errors
// other than those (an older vold that knows no ping, say) still mean a
// vold runs there, of the base level. Not through forwardTo: a ping is
// not a forwarded request, and must not count as one in its metrics.
func (n *node) ping(ctx context.Context, node string) uint32 {
	resp, err := n.askPeer(ctx, node, &volv1.ForwardRequest{Kind: kindPing})
	switch status.Code(err) {
	case codes.OK:
		return pingLevel(resp.GetPayload())
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return 0
	}
	return volfs.LevelBase
}

// pingLevel decodes the level of a ping's answer: volfs.LevelBase for a
// vold that gave none.
func pingLevel(payload []byte) uint32 {
	l, k := binary.Uvarint(payload)
	if k <= 0 || l < uint64(volfs.LevelBase) {
		return volfs.LevelBase
	}
	return uint32(min(l, 1<<31))
}

// askPeer sends req to node's vold over VolPeer, bounded by
// probeTimeout: a question about the node itself (is it ready, what does
// it mount), not a forwarded request, so not counted as one.
func (n *node) askPeer(ctx context.Context, node string, req *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
	c, err := n.pool.client(node)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	actx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return c.Forward(actx, req)
}

// askEach runs ask for every node at once and returns the answers it
// gave (those whose second result is true), by node.
func askEach[T any](nodes []string, ask func(node string) (T, bool)) map[string]T {
	out := map[string]T{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, ok := ask(id)
			if !ok {
				return
			}
			mu.Lock()
			out[id] = v
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// placeAnswering places count replicas as place does, on nodes whose
// vold answers (asked through answers, a batch at a time): a node that
// does not is passed over for the next in placement order. With fallback,
// nodes that did not answer fill the places answering ones cannot, in
// placement order — a volume created while a vold restarts keeps the
// replica count asked for, and that replica catches up when its vold is
// back. It also returns the nodes that did not answer.
func placeAnswering(cands []candidate, count int, exclude map[string]bool, size int64, answers func([]string) map[string]bool, fallback bool) (picked, silent []string) {
	ex := maps.Clone(exclude)
	if ex == nil {
		ex = map[string]bool{}
	}
	for len(picked) < count {
		next := place(cands, count-len(picked), ex, size)
		if len(next) == 0 {
			break
		}
		ok := answers(next)
		for _, id := range next {
			ex[id] = true
			if ok[id] {
				picked = append(picked, id)
			} else {
				silent = append(silent, id)
			}
		}
	}
	if fallback {
		for _, id := range silent {
			if len(picked) == count {
				break
			}
			picked = append(picked, id)
		}
	}
	return picked, silent
}
