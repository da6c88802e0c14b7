package seglog

// entryOverhead is what a cache entry costs besides its data; it is counted
// against the bounds, so that entries of resolved messages (tombstones, kept
// to keep offsets contiguous) are bounded too.
const entryOverhead = 32

type centry struct {
	off  uint64
	data []byte // nil once resolved (a tombstone)
}

// tailCache is a group's tail cache: the entries of its newest committed
// messages, a contiguous suffix of its log, kept until ReadFrom passes them.
// Guarded by Log.mu.
//
// Invariant: every unresolved offset in from..head has its entry in ents[h:],
// whose offsets are from, from+1, ... (contiguous); offsets below from are
// read from disk.
type tailCache struct {
	from   uint64
	ents   []centry
	h      int
	bytes  int64 // data plus overhead of ents[h:]
	listed int   // index in Log.mu.cached; -1 if not listed
}

func (c *tailCache) n() int { return len(c.ents) - c.h }

// at returns the entry of off, or nil.
func (c *tailCache) at(off uint64) *centry {
	if off < c.from || c.n() == 0 {
		return nil
	}
	i := c.h + int(off-c.from)
	if i >= len(c.ents) {
		return nil
	}
	return &c.ents[i]
}

func (l *Log) cacheListLocked(g *group) {
	if g.cache.listed < 0 {
		g.cache.listed = len(l.mu.cached)
		l.mu.cached = append(l.mu.cached, g)
	}
}

func (l *Log) cacheUnlistLocked(g *group) {
	i := g.cache.listed
	if i < 0 {
		return
	}
	last := len(l.mu.cached) - 1
	l.mu.cached[i] = l.mu.cached[last]
	l.mu.cached[i].cache.listed = i
	l.mu.cached[last] = nil
	l.mu.cached = l.mu.cached[:last]
	g.cache.listed = -1
}

// cachePopFrontLocked removes the group's oldest entry.
func (l *Log) cachePopFrontLocked(g *group) {
	c := &g.cache
	e := &c.ents[c.h]
	freed := int64(len(e.data)) + entryOverhead
	c.bytes -= freed
	l.mu.cacheBytes -= freed
	*e = centry{}
	c.h++
	c.from++
	if c.h == len(c.ents) {
		c.ents, c.h = c.ents[:0], 0
		l.cacheUnlistLocked(g)
	} else if c.h >= 1024 && c.h*2 >= len(c.ents) {
		n := copy(c.ents, c.ents[c.h:])
		clear(c.ents[n:])
		c.ents, c.h = c.ents[:n], 0
	}
}

// cacheClearLocked empties the group's cache; offsets below next are on disk.
func (l *Log) cacheClearLocked(g *group, next uint64) {
	c := &g.cache
	l.mu.cacheBytes -= c.bytes
	clear(c.ents)
	c.ents, c.h, c.bytes = c.ents[:0], 0, 0
	c.from = next
	l.cacheUnlistLocked(g)
}

// cachePushLocked caches the committed entry off (== the group's new head).
// An entry that cannot fit in the group's bound empties the cache; the
// oldest entries make room otherwise.
func (l *Log) cachePushLocked(g *group, off uint64, data []byte) {
	c := &g.cache
	cost := int64(len(data)) + entryOverhead
	if off != c.from+uint64(c.n()) || cost > l.opts.GroupCacheBytes || cost > l.opts.CacheBytes || data == nil {
		l.cacheClearLocked(g, off+1)
		return
	}
	for c.n() > 0 && c.bytes+cost > l.opts.GroupCacheBytes {
		l.cachePopFrontLocked(g)
	}
	c.ents = append(c.ents, centry{off: off, data: data})
	c.bytes += cost
	l.mu.cacheBytes += cost
	l.cacheListLocked(g)
	l.cacheEvictLocked(g)
}

// cacheEvictLocked brings the global cache within CacheBytes, taking the
// oldest entry of the listed groups in turn, keep last.
func (l *Log) cacheEvictLocked(keep *group) {
	for l.mu.cacheBytes > l.opts.CacheBytes && len(l.mu.cached) > 0 {
		l.mu.evictNext++
		g := l.mu.cached[l.mu.evictNext%uint64(len(l.mu.cached))]
		if g == keep && len(l.mu.cached) > 1 {
			continue
		}
		l.cachePopFrontLocked(g)
	}
}

// cacheForgetLocked turns the entry of the resolved offset off into a
// tombstone and returns its size; tombstones at the front leave at once.
func (l *Log) cacheForgetLocked(g *group, off uint64) (size uint64, known bool) {
	c := &g.cache
	e := c.at(off)
	if e == nil || e.data == nil {
		return 0, false
	}
	size = uint64(len(e.data))
	e.data = nil
	c.bytes -= int64(size)
	l.mu.cacheBytes -= int64(size)
	for c.n() > 0 && c.ents[c.h].data == nil {
		l.cachePopFrontLocked(g)
	}
	return size, true
}

// cacheDropThroughLocked removes the entries <= x: the reader has passed them.
func (l *Log) cacheDropThroughLocked(g *group, x uint64) {
	c := &g.cache
	for c.n() > 0 && c.ents[c.h].off <= x {
		l.cachePopFrontLocked(g)
	}
	if c.from <= x {
		c.from = x + 1
	}
}

// cacheReadLocked appends to buf up to max unresolved entries from off on
// (off >= g.cache.from) and drops the entries it passed. It returns the
// offset after the last entry it looked at.
func (l *Log) cacheReadLocked(g *group, off uint64, max int, buf []Entry) ([]Entry, uint64) {
	c := &g.cache
	last := uint64(0)
	for e := c.at(off); e != nil && max > 0; e = c.at(off) {
		if e.data != nil && !g.resolved.contains(e.off) {
			buf = append(buf, Entry{Offset: e.off, Data: e.data})
			max--
			l.stats.cacheHits.Add(1)
		}
		last = e.off
		off++
	}
	if last != 0 {
		l.cacheDropThroughLocked(g, last)
	}
	return buf, off
}
