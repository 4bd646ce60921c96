package volfs

import (
	"io"
	"slices"
)

// pageSize is the unit of a file's data in memory.
const pageSize = 1 << 20

// fileData is a regular file's contents, in pages of pageSize bytes (the
// last one shorter when the size is not a multiple). Keeping a file in one
// slice made every append past its capacity reallocate, zero and copy the
// whole file — on every replica, for every write that grew it. With pages,
// a write copies its bytes once and growth never moves what is there; a
// page that a write fills from its start is allocated by appending the
// write's bytes, so it is not zeroed first either.
//
// A whole new page written at once is not copied at all: it is the
// write's own bytes (the applied entry's, which nothing changes
// afterwards), marked shared, and copied only when something writes into
// it in place. An aligned 1 MiB write so costs each replica no copy and
// no freshly touched megabyte. Only whole pages are shared, so a page
// keeps alive at most the buffer it came in (an entry, or a received
// batch of up to a few MiB), never that for a few bytes.
type fileData struct {
	pages  [][]byte
	shared []bool // pages[i] is memory the file does not own
	size   int
}

func (d *fileData) len() int { return d.size }

// fork returns a copy of d that shares its pages, all of them marked
// shared on both sides (with no room past their ends): whichever side
// writes into a page, or grows it, copies it first, so neither ever sees
// the other's changes.
func (d *fileData) fork() fileData {
	for i, p := range d.pages {
		d.pages[i] = p[:len(p):len(p)]
		d.shared[i] = true
	}
	return fileData{pages: slices.Clone(d.pages), shared: slices.Clone(d.shared), size: d.size}
}

// resize sets the size; new bytes are zero.
func (d *fileData) resize(size int) {
	switch {
	case size < d.size:
		keep := (size + pageSize - 1) / pageSize
		clear(d.pages[keep:])
		d.pages = d.pages[:keep]
		d.shared = d.shared[:keep]
		if keep > 0 {
			n := size - (keep-1)*pageSize
			last := d.pages[keep-1][:n]
			switch {
			case d.shared[keep-1]:
				// No room past its end: growing it again must copy it,
				// not write into the memory it shares.
				last = last[:n:n]
			case cap(last) > 4096 && n < cap(last)/4:
				// Give memory back when the last page shrank a lot.
				last = slices.Clone(last)
			}
			d.pages[keep-1] = last
		}
		d.size = size
	case size > d.size:
		d.extend(size-d.size, nil, false)
	}
}

// extend appends n bytes: those of src, or zeros if src is nil. With
// share, a new page may be src's own memory (see fileData), which the
// caller must then never change.
func (d *fileData) extend(n int, src []byte, share bool) {
	for n > 0 {
		if len(d.pages) == 0 || len(d.pages[len(d.pages)-1]) == pageSize {
			d.pages = append(d.pages, nil)
			d.shared = append(d.shared, false)
		}
		i := len(d.pages) - 1
		k := min(n, pageSize-len(d.pages[i]))
		switch {
		case src != nil && share && k == pageSize:
			d.pages[i] = src[:k:k]
			d.shared[i] = true
			src = src[k:]
		case src != nil:
			// A shared page has no room past its end, so appendPage
			// copies it: the page is the file's own from here on.
			d.pages[i] = appendPage(d.pages[i], src[:k])
			d.shared[i] = false
			src = src[k:]
		default:
			d.pages[i] = appendPage(d.pages[i], make([]byte, k))
			d.shared[i] = false
		}
		d.size += k
		n -= k
	}
}

// appendPage appends b to page p, growing its capacity by doubling but
// never past pageSize.
func appendPage(p, b []byte) []byte {
	if len(p)+len(b) > cap(p) && len(p) > 0 {
		np := make([]byte, len(p), min(pageSize, max(2*cap(p), len(p)+len(b))))
		copy(np, p)
		p = np
	}
	return append(p, b...)
}

// writeAt writes b at off, growing the file (a hole before off reads as
// zeros). New pages may share b's memory (see fileData): b must never
// change afterwards.
func (d *fileData) writeAt(b []byte, off int) {
	if off > d.size {
		d.resize(off)
	}
	// The part that overwrites existing bytes, page by page.
	for len(b) > 0 && off < d.size {
		i := off / pageSize
		if d.shared[i] {
			d.pages[i] = slices.Clone(d.pages[i])
			d.shared[i] = false
		}
		k := copy(d.pages[i][off%pageSize:], b)
		b, off = b[k:], off+k
	}
	d.extend(len(b), b, true)
}

// readAt returns a copy of up to n bytes at off.
func (d *fileData) readAt(off, n int) []byte {
	if off >= d.size {
		return nil
	}
	end := min(d.size, off+n)
	var parts [][]byte
	for off < end {
		p := d.pages[off/pageSize]
		k := min(end-off, len(p)-off%pageSize)
		parts = append(parts, p[off%pageSize:off%pageSize+k])
		off += k
	}
	return slices.Concat(parts...)
}

// writeTo writes the contents to w (a buffer or a hash, which never fail).
func (d *fileData) writeTo(w io.Writer) {
	for _, p := range d.pages {
		_, _ = w.Write(p)
	}
}

// dataOf copies b into a new fileData.
func dataOf(b []byte) fileData {
	var d fileData
	d.extend(len(b), b, false)
	return d
}
