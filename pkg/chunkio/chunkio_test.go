package chunkio

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// TestRoundTrip: data written in pieces of any size comes back whole
// through messages of at most Size bytes, each kept as sent.
func TestRoundTrip(t *testing.T) {
	data := make([]byte, 10_000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var msgs [][]byte
	w := &Writer{Size: 1024, Send: func(b []byte) error { msgs = append(msgs, b); return nil }}
	for rest := data; len(rest) > 0; {
		n := min(len(rest), 333)
		if _, err := w.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	msgs = append(msgs, w.Rest())
	for i, m := range msgs[:len(msgs)-1] {
		if len(m) != 1024 {
			t.Fatalf("message %d: %d bytes", i, len(m))
		}
	}
	i := 1
	r := NewReader(msgs[0], func() ([]byte, error) {
		if i == len(msgs) {
			return nil, io.EOF
		}
		i++
		return msgs[i-1], nil
	})
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	if w.Rest() != nil {
		t.Error("Rest twice")
	}
	fail := errors.New("gone")
	w = &Writer{Size: 4, Send: func([]byte) error { return fail }}
	if _, err := w.Write([]byte("12345")); !errors.Is(err, fail) {
		t.Errorf("a failed Send: %v", err)
	}
}
