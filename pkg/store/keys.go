package store

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
)

// MaxKeyLen is the longest document key, in bytes.
const MaxKeyLen = 512

// Pebble key prefixes; see the package doc.
const (
	prefixDoc    = 'd'
	prefixChange = 'c'
	prefixNode   = 'm'
	prefixScalar = 's'
)

var (
	keyRoot       = []byte("sroot")
	keyRev        = []byte("srev")
	keyOldest     = []byte("soldest")
	keyHLC        = []byte("shlc")
	keyLive       = []byte("slive")
	keyTombstones = []byte("stombs")
	keyNodeID     = []byte("snode-id")
	keyFormat     = []byte("sformat")
)

// formatVersion is the on-disk layout version; Open refuses others.
const formatVersion = 1

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
func uvarintLen(v uint64) int { return len(binary.AppendUvarint(nil, v)) }
