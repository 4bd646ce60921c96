package vold

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Volumes live in statd as one document each:
//
//	/volumes/<name>                 field "volume": volumeDoc as JSON
//	/volumemounts/<name>/<node>     field "users": JSON list of mount users
//	/nodes/<id>                     field "vold_port": this daemon's peer port,
//	                                "vold_fs_level": the volume level it knows
//
// The whole volume description is one field on purpose: statd merges
// fields last-writer-wins one by one, and two racing creates of the same
// name must not leave a document with one creator's group and the other's
// members. Mount documents are per node so that only the mounting node
// ever writes one (no lost updates between nodes).
//
// UpdateVolume's changes are fields of their own ("replicas_set",
// "size_set": JSON docSetting) that override the description's, for the
// same reason turned around: a leader rewrites the description (its
// members) now and then, and had the update been in it, a rewrite
// racing the update would undo it. Each names the group it is for, so
// that what was set for a removed volume never applies to a new one of
// the same name.
const (
	volumesPrefix = "/volumes/"
	mountsPrefix  = "/volumemounts/"
	nodesPrefix   = "/nodes/"

	fieldVolume      = "volume"
	fieldReplicasSet = "replicas_set"
	fieldSizeSet     = "size_set"
	fieldUsers       = "users"
	fieldPath        = "path"
	fieldVoldPort    = "vold_port"
	// fieldVoldFree is the free space (bytes) of the node's vold state dir.
	fieldVoldFree = "vold_free_bytes"

	// systemVolume names the cluster's system group (KV and locks). Its
	// leading underscore keeps it out of the user volume namespace.
	systemVolume = "_system"
)

// Volume defaults and bounds.
const (
	DefaultReplicas  = 3
	maxReplicas      = 7
	DefaultSizeBytes = int64(1) << 30
	minSizeBytes     = int64(1) << 20
	maxSizeBytes     = int64(1) << 40
)

// systemGroupBit marks the system group's ID. The host must pick a group's
// state machine from its ID alone (it reopens groups at start, before any
// document is read), so the kind is in the ID: volumes draw IDs below
// 2^62, the system group at or above.
const systemGroupBit = uint64(1) << 62

func isSystemGroup(g raftgroup.GroupID) bool { return uint64(g)&systemGroupBit != 0 }

// newGroupID draws a random group ID of the given kind. Random IDs keep
// racing creators of the same name from ever sharing a group.
func newGroupID(system bool) raftgroup.GroupID {
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		v := binary.LittleEndian.Uint64(b[:]) & (systemGroupBit - 1)
		if v == 0 {
			continue
		}
		if system {
			v |= systemGroupBit
		}
		return raftgroup.GroupID(v)
	}
}

// volumeDoc is a volume as stored in statd.
type volumeDoc struct {
	Group     uint64      `json:"group"`
	Replicas  int         `json:"replicas"`
	SizeBytes int64       `json:"size_bytes"`
	Members   []docMember `json:"members"`
	Created   time.Time   `json:"created"`
	CreatedBy string      `json:"created_by,omitempty"`
}

// docMember places a replica of the volume's group on a node.
type docMember struct {
	Node    string `json:"node"`
	Replica uint64 `json:"replica"`
	// Boot marks an initial member: every initial member bootstraps the
	// group with the same list (the boot members). Members added by repair
	// join empty and catch up from a snapshot.
	Boot bool `json:"boot,omitempty"`
	// Added is when repair added the member (zero for initial members).
	Added time.Time `json:"added,omitzero"`
	// Learner marks a replica added to grow the group (UpdateVolume) that
	// is not a voter yet: it catches up first (replicas.go).
	Learner bool `json:"learner,omitempty"`
}

func (d *volumeDoc) group() raftgroup.GroupID { return raftgroup.GroupID(d.Group) }

// nodes returns the members' nodes, in the document's order.
func (d *volumeDoc) nodes() []string {
	out := make([]string, 0, len(d.Members))
	for _, m := range d.Members {
		out = append(out, m.Node)
	}
	return out
}

// member returns the member on node, if any.
func (d *volumeDoc) member(node string) (docMember, bool) {
	for _, m := range d.Members {
		if m.Node == node {
			return m, true
		}
	}
	return docMember{}, false
}

// bootMembers returns the initial members as raftgroup members.
func (d *volumeDoc) bootMembers(names *nodeNames) ([]raftgroup.Member, error) {
	var out []raftgroup.Member
	for _, m := range d.Members {
		if !m.Boot {
			continue
		}
		n, err := names.add(m.Node)
		if err != nil {
			return nil, err
		}
		out = append(out, raftgroup.Member{Replica: raftgroup.ReplicaID(m.Replica), Node: n})
	}
	return out, nil
}

func (d *volumeDoc) maxReplica() uint64 {
	var m uint64
	for _, x := range d.Members {
		m = max(m, x.Replica)
	}
	return m
}

func encodeVolume(d *volumeDoc) (map[string]*statev1.Value, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	return map[string]*statev1.Value{fieldVolume: {Kind: &statev1.Value_StringValue{StringValue: string(b)}}}, nil
}

// decodeVolume reads a volume document; nil if it has no volume field.
func decodeVolume(doc *statev1.Document) (*volumeDoc, error) {
	raw := doc.GetFields()[fieldVolume].GetStringValue()
	if raw == "" {
		return nil, nil
	}
	var d volumeDoc
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		return nil, fmt.Errorf("volume document %s: %w", doc.GetKey(), err)
	}
	if d.Group == 0 {
		return nil, fmt.Errorf("volume document %s has no group", doc.GetKey())
	}
	if v, ok := docSettingOf(doc, fieldReplicasSet, d.Group); ok {
		d.Replicas = int(v)
	}
	if v, ok := docSettingOf(doc, fieldSizeSet, d.Group); ok {
		d.SizeBytes = v
	}
	return &d, nil
}

// docSetting is a value UpdateVolume set for the volume of group Group.
type docSetting struct {
	Group uint64 `json:"group"`
	Value int64  `json:"value"`
}

// settingField encodes a setting of group's volume.
func settingField(group uint64, v int64) *statev1.Value {
	b, _ := json.Marshal(docSetting{Group: group, Value: v})
	return &statev1.Value{Kind: &statev1.Value_StringValue{StringValue: string(b)}}
}

// docSettingOf returns doc's setting field for the volume of group, if it
// has one (a setting for another group, or one that does not parse, is
// ignored).
func docSettingOf(doc *statev1.Document, field string, group uint64) (int64, bool) {
	raw := doc.GetFields()[field].GetStringValue()
	if raw == "" {
		return 0, false
	}
	var s docSetting
	if err := json.Unmarshal([]byte(raw), &s); err != nil || s.Group != group || s.Value <= 0 {
		return 0, false
	}
	return s.Value, true
}

// docText is what decodeVolume reads of a document, for the cache of
// decoded documents: compared field by field, as the strings statd gave,
// so that a reconcile round over a thousand unchanged documents copies
// none of them.
type docText struct{ volume, replicas, size string }

func textOf(doc *statev1.Document) docText {
	f := doc.GetFields()
	return docText{f[fieldVolume].GetStringValue(), f[fieldReplicasSet].GetStringValue(), f[fieldSizeSet].GetStringValue()}
}

func volumeKey(name string) string { return volumesPrefix + name }

func mountKey(name, node string) string { return mountsPrefix + name + "/" + node }

// validateName checks a user volume name: a DNS label (1 to 63 lower-case
// letters, digits and '-', starting and ending with a letter or digit), so
// that it is safe as a path element, a statd key element and a mount
// directory.
func validateName(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("volume name %q %s: use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit: %w", name, why, errdefs.ErrInvalidArgument)
	}
	if name == "" {
		return bad("is empty")
	}
	if len(name) > 63 {
		return bad("is too long")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(name)-1:
		default:
			return bad(fmt.Sprintf("has %q at %d", c, i))
		}
	}
	return nil
}

// checkSize applies the default and bounds to a requested size.
func checkSize(size int64) (int64, error) {
	switch {
	case size == 0:
		return DefaultSizeBytes, nil
	case size < minSizeBytes || size > maxSizeBytes:
		return 0, fmt.Errorf("volume size %s (%d bytes) is out of range: want 1 MiB to 1 TiB: %w", humanBytes(size), size, errdefs.ErrInvalidArgument)
	}
	return size, nil
}

// checkReplicas applies the default and the bounds to a requested
// replica count; the caller caps it by the live nodes. Even counts are
// allowed when asked for: two replicas survive no failure (a quorum of
// two is both), so the default is three, and placement never turns an odd
// request into an even one except by capping to the nodes there are.
func checkReplicas(r int32) (int, error) {
	switch {
	case r == 0:
		return DefaultReplicas, nil
	case r < 0 || r > maxReplicas:
		return 0, fmt.Errorf("replicas %d is out of range: want 1 to %d: %w", r, maxReplicas, errdefs.ErrInvalidArgument)
	}
	return int(r), nil
}

// candidate is a node that can take a replica.
type candidate struct {
	Node string
	// Hosted is how many replicas (of any group) the node holds.
	Hosted int
	// Free is the space the node has for one more replica: the free space
	// of its vold state dir as it last published it, less the sizes of the
	// volumes it already hosts (a volume's size is reserved whole, since it
	// may fill up at any time). unknownFree when the node published none.
	Free int64
}

// unknownFree is the Free of a node that did not publish its space (an
// older vold): it is not refused for lack of room.
const unknownFree = math.MaxInt64

// place picks n nodes for replicas of a volume of size bytes: among the
// nodes with room for it, fewest replicas hosted first, ties by node ID,
// skipping exclude. It is a pure function of its input, so every node
// would make the same choice from the same view.
func place(cands []candidate, n int, exclude map[string]bool, size int64) []string {
	sorted := slices.Clone(cands)
	slices.SortFunc(sorted, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.Hosted, b.Hosted), cmp.Compare(a.Node, b.Node))
	})
	var out []string
	for _, c := range sorted {
		if len(out) == n {
			break
		}
		if exclude[c.Node] || c.Free < size {
			continue
		}
		out = append(out, c.Node)
	}
	return out
}

// hostedCounts counts the replicas each node holds across volumes, and
// the bytes those volumes may grow to.
func hostedCounts(docs []*volumeDoc) (count map[string]int, bytes map[string]int64) {
	count, bytes = map[string]int{}, map[string]int64{}
	for _, d := range docs {
		for _, m := range d.Members {
			count[m.Node]++
			bytes[m.Node] += d.SizeBytes
		}
	}
	return count, bytes
}

// largestFree is the most room any candidate has, for error messages.
func largestFree(cands []candidate) (string, int64) {
	var node string
	var most int64 = -1
	for _, c := range cands {
		if c.Free > most {
			node, most = c.Node, c.Free
		}
	}
	return node, most
}

// humanBytes formats n in binary units, for messages.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
