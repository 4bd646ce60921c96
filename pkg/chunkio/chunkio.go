// Package chunkio carries a byte stream over a gRPC stream: Writer cuts
// it into messages of a bounded size, Reader joins their data back. A
// tar of a volume or of a task's files goes this way between shoalctl,
// the local daemon and the node that holds the data.
package chunkio

// Writer gathers writes into chunks of Size bytes, each handed to Send
// once full; what is left at the end is Rest, for the stream's last
// message (which also carries its summary).
type Writer struct {
	Size int
	Send func(data []byte) error
	buf  []byte
}

func (w *Writer) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for len(w.buf) >= w.Size {
		// Send may keep the slice (a message in flight): the rest moves
		// to a new one.
		if err := w.Send(w.buf[:w.Size:w.Size]); err != nil {
			return 0, err
		}
		w.buf = append([]byte(nil), w.buf[w.Size:]...)
	}
	return len(p), nil
}

// Rest returns the data not sent yet, and forgets it.
func (w *Writer) Rest() []byte {
	b := w.buf
	w.buf = nil
	return b
}

// Reader reads the data of the messages Next returns, in order, until
// Next's error (io.EOF at a stream's end).
type Reader struct {
	Next func() ([]byte, error)
	buf  []byte
}

// NewReader returns a Reader that starts with first (a stream's first
// message's data) and then reads what next returns.
func NewReader(first []byte, next func() ([]byte, error)) *Reader {
	return &Reader{Next: next, buf: first}
}

func (r *Reader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		b, err := r.Next()
		if err != nil {
			return 0, err
		}
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
