package hugeheap

import (
	"bufio"
	"bytes"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

func TestAnonymousRW(t *testing.T) {
	maps := []byte(`00400000-0059d000 r-xp 00000000 fd:01 1234                               /usr/bin/shoal-vold
0059d000-005d3000 rw-p 0019d000 fd:01 1234                               /usr/bin/shoal-vold
005d3000-005f0000 rw-p 00000000 00:00 0
22c580000000-22c581800000 ---p 00000000 00:00 0
22c581800000-22c58e400000 rw-p 00000000 00:00 0
7fc7cd100000-7fc7cf200000 rw-p 00000000 00:00 0
7fc813c15000-7fc813c19000 r--p 00000000 00:00 0                          [vvar]
7ffc52182000-7ffc521a3000 rw-p 00000000 00:00 0                          [stack]
7f0000000000-7f0000001000 rw-s 00000000 00:05 77                         /dev/zero (deleted)
garbage line
`)
	got := AnonymousRW(maps)
	want := []Mapping{{0x5d3000, 0x5f0000}, {0x22c581800000, 0x22c58e400000}, {0x7fc7cd100000, 0x7fc7cf200000}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

// TestEnableAdvisesTheHeap checks, in /proc/self/smaps, that the mapping
// holding a heap allocation made after Enable carries the kernel's
// huge-page advice ("hg" in VmFlags).
func TestEnableAdvisesTheHeap(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("no transparent huge pages in this kernel")
	}
	if _, err := Enable(64 << 20); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8<<20)
	buf[0] = 1
	runtime.GC() // the advice is renewed after each collection
	runtime.GC()
	addr := uintptr(unsafe.Pointer(&buf[0]))
	flags, ok := vmFlags(t, addr)
	runtime.KeepAlive(buf)
	if !ok {
		t.Fatalf("no mapping holds %#x", addr)
	}
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Fatalf("the heap mapping at %#x is not advised: VmFlags %s", addr, flags)
	}
}

// vmFlags returns the VmFlags of the mapping of /proc/self/smaps that
// holds addr.
func vmFlags(t *testing.T, addr uintptr) (string, bool) {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			lo, hi, _ := strings.Cut(f[0], "-")
			s, err1 := strconv.ParseUint(lo, 16, 64)
			e, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && uintptr(s) <= addr && addr < uintptr(e)
			continue
		}
		if in {
			if flags, ok := strings.CutPrefix(line, "VmFlags:"); ok {
				return strings.TrimSpace(flags), true
			}
		}
	}
	return "", false
}
