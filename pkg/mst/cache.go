package mst

// cache keeps recently used clean nodes by hash, least recently used out
// first. Clean nodes never change and are named by their content, so an
// entry can never go stale: the cache is shared freely by every path that
// reaches the node, and eviction only costs a re-read.
type cache struct {
	max  int
	m    map[Hash]*centry
	head centry // sentinel: head.next is the most recently used
}

type centry struct {
	h          Hash
	n          *node
	prev, next *centry
}

func newCache(max int) *cache {
	c := &cache{max: max, m: make(map[Hash]*centry, min(max, 1024))}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

func (c *cache) get(h Hash) *node {
	e := c.m[h]
	if e == nil {
		return nil
	}
	c.unlink(e)
	c.pushFront(e)
	return e.n
}

func (c *cache) add(h Hash, n *node) {
	if c.max == 0 {
		return
	}
	if e := c.m[h]; e != nil {
		c.unlink(e)
		c.pushFront(e)
		return
	}
	var e *centry
	if len(c.m) >= c.max {
		// Reuse the evicted entry: a scan evicts once per load.
		e = c.head.prev
		c.unlink(e)
		delete(c.m, e.h)
	} else {
		e = new(centry)
	}
	e.h, e.n = h, n
	c.m[h] = e
	c.pushFront(e)
}

func (c *cache) len() int { return len(c.m) }

func (c *cache) unlink(e *centry) {
	e.prev.next = e.next
	e.next.prev = e.prev
}

func (c *cache) pushFront(e *centry) {
	e.prev = &c.head
	e.next = c.head.next
	c.head.next.prev = e
	c.head.next = e
}
