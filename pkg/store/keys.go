package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"unicode/utf8"

	"github.com/cockroachdb/pebble/v2"
	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
)

// MaxKeyLen is the longest document key, in bytes.
const MaxKeyLen = 512

// Pebble key prefixes; see the package doc.
const (
	prefixDoc     = 'd'
	prefixChange  = 'c'
	prefixIndexOp = 'i'
	prefixNode    = 'm'
	prefixScalar  = 's'
)

var (
	keyRoot    = []byte("sroot")
	keyIndexed = []byte("sindexed")
	keyCommit  = []byte("scommit")
	keyOldest  = []byte("soldest")
	keyNodeID  = []byte("snode-id")
	keyFormat  = []byte("sformat")

	// Format 1 kept the committer's scalars under separate keys.
	keyRevV1        = []byte("srev")
	keyHLCV1        = []byte("shlc")
	keyLiveV1       = []byte("slive")
	keyTombstonesV1 = []byte("stombs")
)

// formatVersion is the on-disk layout version; Open refuses others, but
// upgrades format 1 (which had no index op log: its tree always matched
// its documents, so it is format 2 with nothing left to index).
const formatVersion = 2

// ValidateKey checks a document key: an absolute, slash-separated path of
// non-empty segments of printable UTF-8, at most MaxKeyLen bytes, e.g.
// /services/web.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("key is empty: %w", errdefs.ErrInvalidArgument)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("key is %d bytes, limit %d: %w", len(key), MaxKeyLen, errdefs.ErrInvalidArgument)
	case key[0] != '/':
		return fmt.Errorf("key %q must start with /: %w", key, errdefs.ErrInvalidArgument)
	case strings.HasSuffix(key, "/"):
		return fmt.Errorf("key %q must not end with /: %w", key, errdefs.ErrInvalidArgument)
	case strings.Contains(key, "//"):
		return fmt.Errorf("key %q has an empty segment: %w", key, errdefs.ErrInvalidArgument)
	}
	return validText("key", key)
}

// ValidatePrefix checks a List or Watch prefix: empty (everything) or
// starting with /.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if prefix[0] != '/' {
		return fmt.Errorf("prefix %q must start with /: %w", prefix, errdefs.ErrInvalidArgument)
	}
	if len(prefix) > MaxKeyLen {
		return fmt.Errorf("prefix is %d bytes, limit %d: %w", len(prefix), MaxKeyLen, errdefs.ErrInvalidArgument)
	}
	return validText("prefix", prefix)
}

func validText(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8: %w", what, errdefs.ErrInvalidArgument)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%s %q contains a control character: %w", what, s, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// ValidateFieldName checks a field name: 1 to crdt.MaxFieldName bytes of
// letters, digits, '_', '-' and '.'.
func ValidateFieldName(name string) error {
	if name == "" || len(name) > crdt.MaxFieldName {
		return fmt.Errorf("field name %q must be 1 to %d bytes: %w", name, crdt.MaxFieldName, errdefs.ErrInvalidArgument)
	}
	for _, r := range name {
		ok := r == '_' || r == '-' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return fmt.Errorf("field name %q may only contain letters, digits, '_', '-' and '.': %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func docKey(key string) []byte { return append([]byte{prefixDoc}, key...) }

func changeKey(rev uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixChange}, rev)
}

func nodeKey(h [32]byte) []byte { return append([]byte{prefixNode}, h[:]...) }

func indexOpKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixIndexOp}, seq)
}

// IndexKey is a document's MST key: the HLC timestamp of its latest write,
// then its key. See the package doc for why time comes first.
func IndexKey(d crdt.Doc, key string) []byte {
	b := d.MaxStamp().TS.AppendBinary(make([]byte, 0, hlc.EncodedLen+len(key)))
	return append(b, key...)
}

// DocKeyOfIndex returns the document key inside an MST key.
func DocKeyOfIndex(idx []byte) (string, error) {
	if len(idx) <= hlc.EncodedLen {
		return "", fmt.Errorf("index key too short")
	}
	return string(idx[hlc.EncodedLen:]), nil
}

// Record is a stored document with the local revision of its last change.
type Record struct {
	Key string
	Rev uint64
	Doc crdt.Doc
}

// encodeRecord encodes the value stored under d<key>: uvarint revision |
// document encoding.
func encodeRecord(rev uint64, doc []byte) []byte {
	b := binary.AppendUvarint(make([]byte, 0, 10+len(doc)), rev)
	return append(b, doc...)
}

// setRecord adds d<key> = encodeRecord(rev, doc) to b, encoding in place.
func setRecord(b *pebble.Batch, key string, rev uint64, doc []byte) {
	op := b.SetDeferred(1+len(key), uvarintLen(rev)+len(doc))
	op.Key[0] = prefixDoc
	copy(op.Key[1:], key)
	n := binary.PutUvarint(op.Value, rev)
	copy(op.Value[n:], doc)
	op.Finish()
}

// setChange adds c<rev> = encodeChange(key, doc) to b, encoding in place.
func setChange(b *pebble.Batch, rev uint64, key string, doc []byte) {
	op := b.SetDeferred(9, uvarintLen(uint64(len(key)))+len(key)+len(doc))
	op.Key[0] = prefixChange
	binary.BigEndian.PutUint64(op.Key[1:], rev)
	n := binary.PutUvarint(op.Value, uint64(len(key)))
	n += copy(op.Value[n:], key)
	copy(op.Value[n:], doc)
	op.Finish()
}

// DecodeRecord decodes a d<key> value.
func DecodeRecord(b []byte) (rev uint64, d crdt.Doc, err error) {
	rev, n := binary.Uvarint(b)
	if n <= 0 || n != uvarintLen(rev) {
		return 0, crdt.Doc{}, fmt.Errorf("%w: bad revision varint", crdt.ErrCorrupt)
	}
	d, err = crdt.Unmarshal(b[n:])
	return rev, d, err
}

// encodeChange encodes the value stored under c<rev>: uvarint key length |
// key | document encoding.
func encodeChange(key string, doc []byte) []byte {
	b := binary.AppendUvarint(make([]byte, 0, 4+len(key)+len(doc)), uint64(len(key)))
	b = append(b, key...)
	return append(b, doc...)
}

// DecodeChange decodes a c<rev> value.
func DecodeChange(b []byte) (key string, d crdt.Doc, err error) {
	n, m := binary.Uvarint(b)
	if m <= 0 || m != uvarintLen(n) || n > MaxKeyLen || n > uint64(len(b)-m) {
		return "", crdt.Doc{}, fmt.Errorf("%w: bad change key length", crdt.ErrCorrupt)
	}
	key = string(b[m : m+int(n)])
	d, err = crdt.Unmarshal(b[m+int(n):])
	return key, d, err
}

// uvarintLen is the length of the minimal encoding of v; decoders insist on
// it so that every stored value has exactly one encoding.
func uvarintLen(v uint64) int { return max(1, (bits.Len64(v)+6)/7) }

// commitScalars are what every commit updates besides documents and logs,
// kept under one key (scommit) so that a commit writes one scalar.
type commitScalars struct {
	rev        uint64 // latest revision
	opSeq      uint64 // latest index op
	live       uint64 // live documents
	tombstones uint64 // deleted documents still stored
	hlc        hlc.Timestamp
}

const commitScalarsLen = 4*8 + hlc.EncodedLen

// encode returns rev:8 | opSeq:8 | live:8 | tombstones:8 | hlc:12.
func (c commitScalars) encode() []byte {
	b := make([]byte, 0, commitScalarsLen)
	b = binary.BigEndian.AppendUint64(b, c.rev)
	b = binary.BigEndian.AppendUint64(b, c.opSeq)
	b = binary.BigEndian.AppendUint64(b, c.live)
	b = binary.BigEndian.AppendUint64(b, c.tombstones)
	return c.hlc.AppendBinary(b)
}

// readCommitScalars reads scommit; a store that never committed has zero
// scalars.
func readCommitScalars(r pebble.Reader) (commitScalars, error) {
	v, c, err := r.Get(keyCommit)
	if errors.Is(err, pebble.ErrNotFound) {
		return commitScalars{}, nil
	}
	if err != nil {
		return commitScalars{}, fmt.Errorf("read %s: %w", keyCommit, err)
	}
	defer c.Close()
	if len(v) != commitScalarsLen {
		return commitScalars{}, fmt.Errorf("scalar %s has %d bytes: %w", keyCommit, len(v), errdefs.ErrDataLoss)
	}
	ts, _ := hlc.Decode(v[32:])
	return commitScalars{
		rev:        binary.BigEndian.Uint64(v),
		opSeq:      binary.BigEndian.Uint64(v[8:]),
		live:       binary.BigEndian.Uint64(v[16:]),
		tombstones: binary.BigEndian.Uint64(v[24:]),
		hlc:        ts,
	}, nil
}

// indexOp is one entry of the index op log (i<seq>): what a committed write
// does to the MST. A change moves a document's entry from its previous
// index key (if it had one) to its new one; a purge only removes it.
type indexOp struct {
	key    string
	prev   []byte // HLC timestamp (hlc.EncodedLen bytes) of the old entry, nil if none
	next   []byte // HLC timestamp of the new entry, nil for a purge
	digest []byte // digest of the new document (len 32) when next is set
}

const (
	opHasPrev = 1 << iota
	opHasNext
)

// encodeIndexOp encodes an i<seq> value: flags:1 | [prev:12] |
// [next:12 digest:32] | key.
func encodeIndexOp(key string, prev, next hlc.Timestamp, hasPrev, hasNext bool, digest *crdt.Digest) []byte {
	b := make([]byte, 1, 1+2*hlc.EncodedLen+len(digest)+len(key))
	if hasPrev {
		b[0] |= opHasPrev
		b = prev.AppendBinary(b)
	}
	if hasNext {
		b[0] |= opHasNext
		b = next.AppendBinary(b)
		b = append(b, digest[:]...)
	}
	return append(b, key...)
}

// setIndexOp adds i<seq> = encodeIndexOp(...) for a change to b, encoding
// in place.
func setIndexOp(b *pebble.Batch, seq uint64, key string, prev, next hlc.Timestamp, hasPrev bool, digest *crdt.Digest) {
	n := 1 + hlc.EncodedLen + len(digest) + len(key)
	if hasPrev {
		n += hlc.EncodedLen
	}
	op := b.SetDeferred(9, n)
	op.Key[0] = prefixIndexOp
	binary.BigEndian.PutUint64(op.Key[1:], seq)
	v := op.Value[:1]
	v[0] = opHasNext
	if hasPrev {
		v[0] |= opHasPrev
		v = prev.AppendBinary(v)
	}
	v = next.AppendBinary(v)
	v = append(v, digest[:]...)
	v = append(v, key...)
	_ = v // written in place: op.Value has exactly this capacity
	op.Finish()
}

// decodeIndexOp decodes an i<seq> value. The slices in the result alias b.
func decodeIndexOp(b []byte) (indexOp, error) {
	var op indexOp
	bad := func(what string) (indexOp, error) {
		return indexOp{}, fmt.Errorf("%w: index op: %s", crdt.ErrCorrupt, what)
	}
	if len(b) == 0 || b[0]&^(opHasPrev|opHasNext) != 0 || b[0] == 0 {
		return bad("bad flags")
	}
	flags, rest := b[0], b[1:]
	if flags&opHasPrev != 0 {
		if len(rest) < hlc.EncodedLen {
			return bad("short")
		}
		op.prev, rest = rest[:hlc.EncodedLen], rest[hlc.EncodedLen:]
	}
	if flags&opHasNext != 0 {
		n := hlc.EncodedLen + len(crdt.Digest{})
		if len(rest) < n {
			return bad("short")
		}
		op.next, op.digest, rest = rest[:hlc.EncodedLen], rest[hlc.EncodedLen:n], rest[n:]
	}
	if len(rest) == 0 || len(rest) > MaxKeyLen {
		return bad("bad key length")
	}
	op.key = string(rest)
	return op, nil
}

// indexKeyOf returns the MST key of a document whose latest write has the
// encoded timestamp ts: ts | key (see IndexKey).
func indexKeyOf(dst, ts []byte, key string) []byte {
	return append(append(dst[:0], ts...), key...)
}
