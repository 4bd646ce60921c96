package volfs_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

func FuzzDecodeOp(f *testing.F) {
	f.Add((&volfs.Op{Kind: volfs.KindWrite, Ino: 5, Offset: 10, Data: []byte("x")}).Encode())
	f.Add((&volfs.Op{Kind: volfs.KindRename, Parent: 1, Name: "a", NewParent: 2, NewName: "b", Flags: 1}).Encode())
	f.Add((&volfs.Op{Kind: volfs.KindUnlink, Parent: 1, Name: "a", Node: "n", Session: "s", Open: []uint64{2, 300}}).Encode())
	f.Add([]byte{0x08})
	f.Fuzz(func(t *testing.T, b []byte) {
		op, err := volfs.DecodeOp(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to something that decodes the same.
		op2, err := volfs.DecodeOp(op.Encode())
		if err != nil {
			t.Fatal(err)
		}
		if len(op.Data) == 0 {
			op.Data = nil
		}
		if len(op2.Data) == 0 {
			op2.Data = nil
		}
		if !reflect.DeepEqual(op, op2) {
			t.Fatalf("%+v != %+v", op, op2)
		}
	})
}

func FuzzDecodeResult(f *testing.F) {
	f.Add((&volfs.Result{Attr: &volfs.Attr{Ino: 3, Mode: volfs.ModeDir | 0o755}}).Encode())
	f.Add((&volfs.Result{Entries: []volfs.DirEntry{{Name: "a", Ino: 2}}, More: true, Statfs: &volfs.Statfs{Used: 4}}).Encode())
	f.Add((&volfs.Result{Errno: 2}).Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := volfs.DecodeResult(b)
		if err != nil {
			return
		}
		r2, err := volfs.DecodeResult(r.Encode())
		if err != nil {
			t.Fatal(err)
		}
		if r.Errno != r2.Errno || r.More != r2.More || len(r.Entries) != len(r2.Entries) || !bytes.Equal(r.Data, r2.Data) {
			t.Fatalf("%+v != %+v", r, r2)
		}
	})
}

// FuzzRestore feeds Restore arbitrary snapshots: it must refuse or accept
// without panicking, and an accepted state must be consistent and usable.
func FuzzRestore(f *testing.F) {
	fs := volfs.New()
	for i, op := range randomOpsSeed(1, 60) {
		_, _ = fs.Apply([]raftgroup.Entry{{Index: uint64(i + 1), Data: op}})
	}
	snap, _ := fs.Snapshot()
	f.Add(snap)
	empty, _ := volfs.New().Snapshot()
	f.Add(empty)
	f.Fuzz(func(t *testing.T, b []byte) {
		fs := volfs.New()
		if err := fs.Restore(b); err != nil {
			return
		}
		if err := fs.CheckInvariants(); err != nil {
			t.Fatalf("restored an inconsistent state: %v", err)
		}
		for i, op := range randomOpsSeed(2, 50) {
			if _, err := fs.Apply([]raftgroup.Entry{{Index: uint64(i + 1), Data: op}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := fs.CheckInvariants(); err != nil {
			t.Fatalf("after ops: %v", err)
		}
	})
}

// FuzzApply applies arbitrary op bytes to a populated FS.
func FuzzApply(f *testing.F) {
	for _, op := range randomOpsSeed(3, 30) {
		f.Add(op)
	}
	base := randomOpsSeed(4, 80)
	f.Fuzz(func(t *testing.T, b []byte) {
		fs := volfs.New()
		for i, op := range base {
			_, _ = fs.Apply([]raftgroup.Entry{{Index: uint64(i + 1), Data: op}})
		}
		res, err := fs.Apply([]raftgroup.Entry{{Index: 100, Data: b}})
		if errors.Is(err, volfs.ErrLevel) {
			// A level above this code's: the replica stops, by
			// design, with its state as it was.
			if err := fs.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := volfs.DecodeResult(res[0]); err != nil {
			t.Fatal(err)
		}
		if err := fs.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		_, _ = fs.Query(b)
	})
}
