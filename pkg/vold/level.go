package vold

import (
	"context"
	"maps"
	"slices"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// Volume levels (volfs.MaxLevel). Each vold publishes the highest level
// it lets volumes reach in its node document (vold_fs_level: the highest
// it knows, or its volume_level when an operator pinned it lower; a vold
// from before levels publishes none, which is volfs.LevelBase), and
// answers pings with it. A group's leader raises its volume to its own
// level once every member's vold has published at least that and
// answers so (behind), so replicas on older volds never meet entries
// they would apply differently: volds can be upgraded one node at a time
// under a volume in use, and the volume takes the new semantics once the
// last of its nodes runs the new vold. Replacement replicas go only to
// nodes whose vold lets the volume's level by the same two tests
// (repair.go). Levels never go down: a vold that knows levels, but not a
// volume's, stops applying it (volfs.ErrLevel); one from before levels
// refuses its snapshots but would apply its entries its own way, so an
// operator who may need to downgrade pins volume_level first.

// fieldVoldFSLevel is the node document's field with the level its vold
// lets volumes reach (level).
const fieldVoldFSLevel = "vold_fs_level"

// level is the highest volume level this vold lets volumes reach: its
// volume_level, or volfs.MaxLevel.
func (n *node) level() uint32 {
	if l := n.cfg.VolumeLevel; l > 0 {
		return min(l, volfs.MaxLevel)
	}
	return volfs.MaxLevel
}

// fsLevel is the highest volume level node's vold lets volumes reach, as
// it last published it: volfs.LevelBase when it published none (a vold
// before levels), 0 for a node without a document.
func (n *node) fsLevel(node string) uint32 {
	if node == n.id {
		return n.level()
	}
	d := n.mirror.Get(nodesPrefix + node)
	if d == nil {
		return 0
	}
	v, ok := d.GetFields()[fieldVoldFSLevel]
	if !ok {
		return volfs.LevelBase
	}
	return uint32(min(max(v.GetIntValue(), 0), 1<<31))
}

// behind returns the first of nodes whose vold does not let volumes
// reach level, or "". The levels published in node documents are read
// first (publishedBelow), which costs nothing; then the volds are asked
// through ask, because a document keeps the level its last vold
// published: a node downgraded to a vold from before levels, which
// publishes none, would go on showing the newer vold's. A vold that does
// not answer is behind too.
func (n *node) behind(nodes []string, level uint32, ask *levelAsk) string {
	if node := n.publishedBelow(nodes, level); node != "" {
		return node
	}
	answered := ask.levels(nodes)
	for _, node := range nodes {
		if answered[node] < level {
			return node
		}
	}
	return ""
}

// voldLevels returns the level each of nodes' volds lets volumes reach
// as behind judges it: the lower of its published level and its answer
// to a fresh ping (0: no answer).
func (n *node) voldLevels(ctx context.Context, nodes []string) map[string]uint32 {
	out := n.pingedLevels(ctx, nodes, true)
	for node, l := range out {
		out[node] = min(l, n.fsLevel(node))
	}
	return out
}

// publishedBelow returns the first of nodes whose document does not
// show a level of at least level, or "".
func (n *node) publishedBelow(nodes []string, level uint32) string {
	for _, node := range nodes {
		if n.fsLevel(node) < level {
			return node
		}
	}
	return ""
}

// levelAsk asks volds their levels (a ping, whose answer carries it),
// each at most once: one is made per raise decision, or per round of
// them, so that a level is never older than the decision that uses it
// (pingedLevels' fresh) and a node is asked once however many volumes it
// holds. Only a group's leader asks, and only while the group is below
// the level and every member's document shows it: a member cut off then
// costs its round one ping's timeout (probeTimeout).
type levelAsk struct {
	ctx    context.Context
	n      *node
	answer map[string]uint32
}

func (n *node) askLevels(ctx context.Context) *levelAsk {
	return &levelAsk{ctx: ctx, n: n, answer: map[string]uint32{}}
}

// levels returns the levels of nodes' volds (0: no answer), asking those
// not asked yet.
func (a *levelAsk) levels(nodes []string) map[string]uint32 {
	var ask []string
	for _, node := range nodes {
		if _, ok := a.answer[node]; !ok {
			ask = append(ask, node)
		}
	}
	if len(ask) > 0 {
		maps.Copy(a.answer, a.n.pingedLevels(a.ctx, ask, true))
	}
	return a.answer
}

// volumeLevel is the level of group g's volume as this node's replica
// has applied it (0 for the system group, or no replica).
func volumeLevel(h *raftgroup.Host, g raftgroup.GroupID) uint32 {
	if fs := volumeFS(h, g); fs != nil {
		return fs.Level()
	}
	return 0
}

// volumeFS returns this node's replica of volume group g's filesystem
// (nil for the system group, or no replica).
func volumeFS(h *raftgroup.Host, g raftgroup.GroupID) *volfs.FS {
	sm, err := h.Machine(g)
	if err != nil {
		return nil
	}
	fs, _ := sm.(*volfs.FS)
	return fs
}

// raiseNewVolume raises a volume just created to this vold's level when
// every member's vold lets it, so that it has its semantics from its
// first write; otherwise, or when that fails, raiseLevels does later.
func (n *node) raiseNewVolume(ctx context.Context, name string, d *volumeDoc) {
	level := n.level()
	if level <= volfs.LevelBase || n.behind(d.nodes(), level, n.askLevels(ctx)) != "" {
		return
	}
	c := &volfs.Client{B: &volumeBackend{n: n, name: name, fixed: d}}
	if _, err := c.SetLevel(ctx, level); err != nil {
		n.log.Warn("raise new volume's level (a leader raises it later)", "volume", name, "level", level, "err", err)
	}
}

// raiseLevels raises every volume this node leads to this vold's level
// once each of its members' volds lets it, the members its document
// names included. A volume already there costs a lookup: the loop runs
// every repair round.
func (n *node) raiseLevels(ctx context.Context, h *raftgroup.Host) {
	level := n.level()
	var docs map[raftgroup.GroupID]*volumeDoc // read once a group needs them
	ask := n.askLevels(ctx)
	for _, g := range h.Groups() {
		if ctx.Err() != nil {
			return
		}
		if l := volumeLevel(h, g); l == 0 || l >= level {
			continue
		}
		// The document's members' published levels first, which takes
		// no lock (a pinned member holds back every volume it has a
		// replica of, each round); then, on the leader only, the
		// group's configuration's too (a member added to the document
		// and not yet to the group, repair's step 2, joins it next), and
		// every member's vold is asked.
		if docs == nil {
			docs = map[raftgroup.GroupID]*volumeDoc{}
			for _, d := range n.volumeDocs() {
				docs[d.group()] = d
			}
		}
		d := docs[g]
		if d == nil {
			continue
		}
		if n.publishedBelow(d.nodes(), level) != "" {
			continue
		}
		st, ok := leading(h, g)
		if !ok {
			continue
		}
		nodes := d.nodes()
		for _, m := range slices.Concat(st.Voters, st.Learners) {
			nodes = append(nodes, n.names.name(m.Node))
		}
		if node := n.behind(nodes, level, ask); node != "" {
			n.log.Debug("volume level not raised: a member's vold does not let it", "group", uint64(g), "level", level, "node", node)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, changeTimeout)
		l, err := (&volfs.Client{B: volfs.HostBackend{Host: h, Group: g}}).SetLevel(cctx, level)
		cancel()
		if err != nil {
			n.log.Warn("raise volume level", "group", uint64(g), "level", level, "err", err)
			continue
		}
		n.log.Info("volume level raised", "group", uint64(g), "level", l)
	}
}
