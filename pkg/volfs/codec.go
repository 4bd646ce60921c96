package volfs

import (
	"errors"
	"fmt"
	"syscall"

	"google.golang.org/protobuf/encoding/protowire"
)

// The wire format is protobuf's (written with protowire, no generated
// code): fields are tagged, zero values are left out, and unknown fields
// are skipped. It is compact, well understood, and the decoders are small
// enough to fuzz exhaustively. Field numbers below are part of the
// replicated format: never renumber them.

// ErrMalformed is returned for bytes that do not decode.
var ErrMalformed = errors.New("volfs: malformed encoding")

// Op fields.
const (
	fOpKind protowire.Number = iota + 1
	fOpIno
	fOpParent
	fOpName
	fOpNewParent
	fOpNewName
	fOpMode
	fOpUID
	fOpGID
	fOpFlags
	fOpOffset
	fOpSize
	fOpData
	fOpValid
	fOpAtime
	fOpMtime
	fOpAfter
	fOpNode
	fOpSession
	fOpOpen
)

// Result fields.
const (
	fResErrno protowire.Number = iota + 1
	fResAttr
	fResData
	fResEntry
	fResMore
	fResStatfs
)

// Attr fields.
const (
	fAttrIno protowire.Number = iota + 1
	fAttrMode
	fAttrNlink
	fAttrUID
	fAttrGID
	fAttrSize
	fAttrAtime
	fAttrMtime
	fAttrCtime
)

// DirEntry and Statfs fields.
const (
	fEntName protowire.Number = 1
	fEntIno  protowire.Number = 2
	fEntMode protowire.Number = 3

	fStLimit  protowire.Number = 1
	fStUsed   protowire.Number = 2
	fStInodes protowire.Number = 3
	fStHeld   protowire.Number = 4
	fStLevel  protowire.Number = 5
)

func putVarint(b []byte, n protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func putBytes(b []byte, n protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func putString(b []byte, n protowire.Number, v string) []byte {
	if v == "" {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendString(b, v)
}

// putMessage appends a length-delimited sub-message even when it is empty
// (its presence carries meaning, e.g. an Attr in a Result).
func putMessage(b []byte, n protowire.Number, msg []byte) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, msg)
}

// fields walks the fields of a message, calling fn with each one's number,
// type, varint value (for varints) and bytes (for length-delimited ones).
// Other wire types are skipped.
func fields(b []byte, fn func(n protowire.Number, t protowire.Type, v uint64, p []byte) error) error {
	for len(b) > 0 {
		n, t, m := protowire.ConsumeTag(b)
		if m < 0 {
			return fmt.Errorf("%w: %v", ErrMalformed, protowire.ParseError(m))
		}
		b = b[m:]
		var (
			v uint64
			p []byte
		)
		switch t {
		case protowire.VarintType:
			v, m = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			p, m = protowire.ConsumeBytes(b)
		default:
			m = protowire.ConsumeFieldValue(n, t, b)
		}
		if m < 0 {
			return fmt.Errorf("%w: field %d: %v", ErrMalformed, n, protowire.ParseError(m))
		}
		b = b[m:]
		if err := fn(n, t, v, p); err != nil {
			return err
		}
	}
	return nil
}

// u32 narrows a decoded varint, refusing values that do not fit.
func u32(v uint64) (uint32, error) {
	if v > 1<<32-1 {
		return 0, fmt.Errorf("%w: value %d overflows 32 bits", ErrMalformed, v)
	}
	return uint32(v), nil
}

// Encode encodes the op for Backend.Mutate or Backend.Query.
func (o *Op) Encode() []byte {
	b := make([]byte, 0, 32+len(o.Name)+len(o.NewName)+len(o.Data)+len(o.After))
	b = putVarint(b, fOpKind, uint64(o.Kind))
	b = putVarint(b, fOpIno, o.Ino)
	b = putVarint(b, fOpParent, o.Parent)
	b = putString(b, fOpName, o.Name)
	b = putVarint(b, fOpNewParent, o.NewParent)
	b = putString(b, fOpNewName, o.NewName)
	b = putVarint(b, fOpMode, uint64(o.Mode))
	b = putVarint(b, fOpUID, uint64(o.UID))
	b = putVarint(b, fOpGID, uint64(o.GID))
	b = putVarint(b, fOpFlags, uint64(o.Flags))
	b = putVarint(b, fOpOffset, o.Offset)
	b = putVarint(b, fOpSize, o.Size)
	b = putBytes(b, fOpData, o.Data)
	b = putVarint(b, fOpValid, uint64(o.Valid))
	b = putVarint(b, fOpAtime, uint64(o.Atime))
	b = putVarint(b, fOpMtime, uint64(o.Mtime))
	b = putString(b, fOpAfter, o.After)
	b = putString(b, fOpNode, o.Node)
	b = putString(b, fOpSession, o.Session)
	if len(o.Open) > 0 {
		var packed []byte
		for _, ino := range o.Open {
			packed = protowire.AppendVarint(packed, ino)
		}
		b = putBytes(b, fOpOpen, packed)
	}
	return b
}

// DecodeOp decodes an encoded op. Data aliases b.
func DecodeOp(b []byte) (Op, error) {
	var o Op
	err := fields(b, func(n protowire.Number, t protowire.Type, v uint64, p []byte) error {
		var err error
		switch {
		case t == protowire.VarintType:
			switch n {
			case fOpKind:
				var k uint32
				k, err = u32(v)
				o.Kind = Kind(k)
			case fOpIno:
				o.Ino = v
			case fOpParent:
				o.Parent = v
			case fOpNewParent:
				o.NewParent = v
			case fOpMode:
				o.Mode, err = u32(v)
			case fOpUID:
				o.UID, err = u32(v)
			case fOpGID:
				o.GID, err = u32(v)
			case fOpFlags:
				o.Flags, err = u32(v)
			case fOpOffset:
				o.Offset = v
			case fOpSize:
				o.Size = v
			case fOpValid:
				o.Valid, err = u32(v)
			case fOpAtime:
				o.Atime = int64(v)
			case fOpMtime:
				o.Mtime = int64(v)
			}
		case t == protowire.BytesType:
			switch n {
			case fOpName:
				o.Name = string(p)
			case fOpNewName:
				o.NewName = string(p)
			case fOpData:
				o.Data = p
			case fOpAfter:
				o.After = string(p)
			case fOpNode:
				o.Node = string(p)
			case fOpSession:
				o.Session = string(p)
			case fOpOpen:
				for len(p) > 0 {
					ino, m := protowire.ConsumeVarint(p)
					if m < 0 {
						return fmt.Errorf("%w: open inodes: %v", ErrMalformed, protowire.ParseError(m))
					}
					o.Open = append(o.Open, ino)
					p = p[m:]
				}
			}
		}
		return err
	})
	if err != nil {
		return Op{}, err
	}
	if o.Kind == 0 {
		return Op{}, fmt.Errorf("%w: op without kind", ErrMalformed)
	}
	return o, nil
}

func encodeAttr(a *Attr) []byte {
	b := make([]byte, 0, 64)
	b = putVarint(b, fAttrIno, a.Ino)
	b = putVarint(b, fAttrMode, uint64(a.Mode))
	b = putVarint(b, fAttrNlink, uint64(a.Nlink))
	b = putVarint(b, fAttrUID, uint64(a.UID))
	b = putVarint(b, fAttrGID, uint64(a.GID))
	b = putVarint(b, fAttrSize, a.Size)
	b = putVarint(b, fAttrAtime, uint64(a.Atime))
	b = putVarint(b, fAttrMtime, uint64(a.Mtime))
	b = putVarint(b, fAttrCtime, uint64(a.Ctime))
	return b
}

func decodeAttr(b []byte) (*Attr, error) {
	a := &Attr{}
	err := fields(b, func(n protowire.Number, t protowire.Type, v uint64, _ []byte) error {
		if t != protowire.VarintType {
			return nil
		}
		var err error
		switch n {
		case fAttrIno:
			a.Ino = v
		case fAttrMode:
			a.Mode, err = u32(v)
		case fAttrNlink:
			a.Nlink, err = u32(v)
		case fAttrUID:
			a.UID, err = u32(v)
		case fAttrGID:
			a.GID, err = u32(v)
		case fAttrSize:
			a.Size = v
		case fAttrAtime:
			a.Atime = int64(v)
		case fAttrMtime:
			a.Mtime = int64(v)
		case fAttrCtime:
			a.Ctime = int64(v)
		}
		return err
	})
	return a, err
}

// Encode encodes the result (what Apply and Query return).
func (r *Result) Encode() []byte {
	b := make([]byte, 0, 16+len(r.Data)+len(r.Entries)*24)
	b = putVarint(b, fResErrno, uint64(r.Errno))
	if r.Attr != nil {
		b = putMessage(b, fResAttr, encodeAttr(r.Attr))
	}
	b = putBytes(b, fResData, r.Data)
	for _, e := range r.Entries {
		var m []byte
		m = putString(m, fEntName, e.Name)
		m = putVarint(m, fEntIno, e.Ino)
		m = putVarint(m, fEntMode, uint64(e.Mode))
		b = putMessage(b, fResEntry, m)
	}
	if r.More {
		b = putVarint(b, fResMore, 1)
	}
	if r.Statfs != nil {
		var m []byte
		m = putVarint(m, fStLimit, uint64(r.Statfs.Limit))
		m = putVarint(m, fStUsed, uint64(r.Statfs.Used))
		m = putVarint(m, fStInodes, r.Statfs.Inodes)
		m = putVarint(m, fStHeld, r.Statfs.Held)
		m = putVarint(m, fStLevel, uint64(r.Statfs.Level))
		b = putMessage(b, fResStatfs, m)
	}
	return b
}

// DecodeResult decodes a result. Data aliases b.
func DecodeResult(b []byte) (Result, error) {
	var r Result
	err := fields(b, func(n protowire.Number, t protowire.Type, v uint64, p []byte) error {
		switch {
		case n == fResErrno && t == protowire.VarintType:
			e, err := u32(v)
			r.Errno = syscall.Errno(e)
			return err
		case n == fResMore && t == protowire.VarintType:
			r.More = v != 0
		case n == fResAttr && t == protowire.BytesType:
			a, err := decodeAttr(p)
			r.Attr = a
			return err
		case n == fResData && t == protowire.BytesType:
			r.Data = p
		case n == fResEntry && t == protowire.BytesType:
			var e DirEntry
			err := fields(p, func(n protowire.Number, t protowire.Type, v uint64, p []byte) error {
				var err error
				switch {
				case n == fEntName && t == protowire.BytesType:
					e.Name = string(p)
				case n == fEntIno && t == protowire.VarintType:
					e.Ino = v
				case n == fEntMode && t == protowire.VarintType:
					e.Mode, err = u32(v)
				}
				return err
			})
			r.Entries = append(r.Entries, e)
			return err
		case n == fResStatfs && t == protowire.BytesType:
			st := &Statfs{}
			err := fields(p, func(n protowire.Number, t protowire.Type, v uint64, _ []byte) error {
				if t != protowire.VarintType {
					return nil
				}
				var err error
				switch n {
				case fStLimit:
					st.Limit = int64(v)
				case fStUsed:
					st.Used = int64(v)
				case fStInodes:
					st.Inodes = v
				case fStHeld:
					st.Held = v
				case fStLevel:
					st.Level, err = u32(v)
				}
				return err
			})
			r.Statfs = st
			return err
		}
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	return r, nil
}
