//go:build race

package hugeheap

// raceEnabled: the race detector gives every heap page shadow pages of
// its own, which fault in when the heap is first written whatever the
// reserve did, so a reserve's effect on faults and RSS cannot be seen.
const raceEnabled = true
