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
type fileData struct {
	pages [][]byte
	size  int
}

func (d *fileData) len() int { return d.size }

// resize sets the size; new bytes are zero.
func (d *fileData) resize(size int) {
	switch {
	case size < d.size:
		keep := (size + pageSize - 1) / pageSize
		clear(d.pages[keep:])
		d.pages = d.pages[:keep]
		if keep > 0 {
			last := d.pages[keep-1][:size-(keep-1)*pageSize]
			// Give memory back when the last page shrank a lot.
			if cap(last) > 4096 && len(last) < cap(last)/4 {
				last = slices.Clone(last)
			}
			d.pages[keep-1] = last
		}
		d.size = size
	case size > d.size:
		d.extend(size-d.size, nil)
	}
}

// extend appends n bytes: those of src, or zeros if src is nil.
func (d *fileData) extend(n int, src []byte) {
	for n > 0 {
		if len(d.pages) == 0 || len(d.pages[len(d.pages)-1]) == pageSize {
			d.pages = append(d.pages, nil)
		}
		i := len(d.pages) - 1
		k := min(n, pageSize-len(d.pages[i]))
		if src != nil {
			d.pages[i] = appendPage(d.pages[i], src[:k])
			src = src[k:]
		} else {
			d.pages[i] = appendPage(d.pages[i], make([]byte, k))
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
// zeros).
func (d *fileData) writeAt(b []byte, off int) {
	if off > d.size {
		d.resize(off)
	}
	// The part that overwrites existing bytes, page by page.
	for len(b) > 0 && off < d.size {
		p := d.pages[off/pageSize]
		k := copy(p[off%pageSize:], b)
		b, off = b[k:], off+k
	}
	d.extend(len(b), b)
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
	d.extend(len(b), b)
	return d
}
