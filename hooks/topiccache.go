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
// flood of distinct topics costs a rebuild, never unbounded memory. Entries
// gone stale are swept out as the cache grows (sweepLocked), so that what a
// stale entry holds (sessions, groups: gone since) does not stay for as long
// as nobody publishes to its topic again. Versions only grow.
type topicCache[V any] struct {
	m                    sync.Map // string -> *cached[V]
	entries, bytes       atomic.Int64
	maxEntries, maxBytes int64

	// sweepNext is the entry count past which the next sweep runs: twice
	// what the last one left plus sweepSlack, so sweeping costs O(1) per put.
	sweepNext atomic.Int64
	sweeping  sync.Mutex // one sweep at a time; puts do not wait for it
}

// sweepSlack is how many entries may be added past twice the count the last
// sweep left before the next sweep.
const sweepSlack = 1024

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
		c.sweepNext.Store(0)
	}
	if old, loaded := c.m.Swap(strings.Clone(topic), &cached[V]{version: version, v: v, cost: cost}); loaded {
		c.entries.Add(-1) // a stale entry replaced
		c.bytes.Add(-old.(*cached[V]).cost)
	}
	if c.entries.Load() > max(c.sweepNext.Load(), sweepSlack) && c.sweeping.TryLock() {
		c.sweepStale(version)
		c.sweeping.Unlock()
	}
}

// sweepStale deletes the entries computed before version (stale: the index
// changed since), and sets when the next sweep runs.
func (c *topicCache[V]) sweepStale(version uint64) {
	c.m.Range(func(k, e any) bool {
		if old := e.(*cached[V]); old.version < version && c.m.CompareAndDelete(k, e) {
			c.entries.Add(-1)
			c.bytes.Add(-old.cost)
		}
		return true
	})
	c.sweepNext.Store(2*c.entries.Load() + sweepSlack)
}
