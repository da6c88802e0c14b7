package hooks

import (
	"strings"
	"sync"
	"sync/atomic"
)

// topicCache maps topic names to values derived from an index that changes
// rarely (subscriptions); an entry is valid while the index version it was
// computed at is current. It keeps a copy of each topic, never the string
// mochi decoded (a view into the whole packet, payload included), and it is
// bounded in entries and in bytes: past either bound it starts over, so a
// flood of distinct topics costs a rebuild, never unbounded memory.
type topicCache[V any] struct {
	m                    sync.Map // string -> *cached[V]
	entries, bytes       atomic.Int64
	maxEntries, maxBytes int64
}

type cached[V any] struct {
	version uint64
	v       V
	cost    int64
}

// cacheEntryOverhead is what one entry costs besides its topic and value,
// roughly (map slot, entry, string header).
const cacheEntryOverhead = 96

func newTopicCache[V any](maxEntries, maxBytes int64) *topicCache[V] {
	return &topicCache[V]{maxEntries: maxEntries, maxBytes: maxBytes}
}

// get returns the value cached for topic at version, if any.
func (c *topicCache[V]) get(topic string, version uint64) (V, bool) {
	if e, ok := c.m.Load(topic); ok && e.(*cached[V]).version == version {
		return e.(*cached[V]).v, true
	}
	var zero V
	return zero, false
}

// put caches v for topic at version; cost is what v holds in bytes besides
// the topic.
func (c *topicCache[V]) put(topic string, version uint64, v V, cost int64) {
	cost += int64(len(topic)) + cacheEntryOverhead
	if cost > c.maxBytes {
		return // one entry alone would not fit
	}
	if c.entries.Add(1) > c.maxEntries || c.bytes.Add(cost) > c.maxBytes {
		c.m.Clear()
		c.entries.Store(1)
		c.bytes.Store(cost)
	}
	if old, loaded := c.m.Swap(strings.Clone(topic), &cached[V]{version: version, v: v, cost: cost}); loaded {
		c.entries.Add(-1) // a stale entry replaced
		c.bytes.Add(-old.(*cached[V]).cost)
	}
}

// clear empties the cache.
func (c *topicCache[V]) clear() {
	c.m.Clear()
	c.entries.Store(0)
	c.bytes.Store(0)
}
