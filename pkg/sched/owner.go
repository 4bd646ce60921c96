package sched

// Owner returns the node that owns service among the alive nodes: the one
// with the highest rendezvous weight (highest-random-weight hashing, Thaler
// and Ravishankar 1998), ties broken by the greater node ID. It returns ""
// when alive is empty. The order of alive does not matter.
//
// Rendezvous hashing moves a service only when its owner leaves or when a
// joining node outweighs the current owner: removing a node reassigns only
// the services it owned, adding one takes over about 1/N of them, all to
// the newcomer.
//
// NB: the weight function is part of the protocol: every node of a
// cluster must compute the same weights, so never change it in a rolling
// upgrade.
func Owner(service string, alive []string) string {
	best, bestW := "", uint64(0)
	h := keyHash(service)
	for _, n := range alive {
		w := weight(h, n)
		if best == "" || w > bestW || w == bestW && n > best {
			best, bestW = n, w
		}
	}
	return best
}

// FNV-1a, 64 bit.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// keyHash is the first half of a weight: FNV-1a of key and a separator.
func keyHash(key string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= fnvPrime
	}
	h ^= 0xff // no string byte sequence collides with a key/node boundary
	h *= fnvPrime
	return h
}

// weight continues the FNV-1a of keyHash over node and finishes it with
// the splitmix64 mixer: FNV alone has weak high bits for short, similar
// strings such as n1, n2, n3.
func weight(keyHash uint64, node string) uint64 {
	h := keyHash
	for i := 0; i < len(node); i++ {
		h ^= uint64(node[i])
		h *= fnvPrime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Up is the liveness view that owners and placement act on: the members
// that membership reports alive, less the nodes whose scheduler said
// their machine is shutting down (shutDown reports it from the node's
// document; self is always kept, as its own loop only runs while it is
// up). Such a node stops its tasks and records them stopped before it
// goes, and is left out at once, where membership would report it alive
// until its statd stops and dead only after its failure detector's
// timeout: so the services it owned get another owner, its tasks are
// replaced elsewhere at once, and nothing new is placed on it.
func Up(alive []string, self string, shutDown func(id string) bool) []string {
	out := make([]string, 0, len(alive))
	for _, id := range alive {
		if id == self || !shutDown(id) {
			out = append(out, id)
		}
	}
	return out
}
