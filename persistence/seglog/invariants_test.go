package seglog

import (
	"errors"
	"fmt"
)

// checkInvariants verifies the index, counters and caches against each other
// (see the package doc). It scans everything, so only tests call it.
func (l *Log) checkInvariants() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 10 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	segLive := make(map[*segment]uint64)
	var cacheBytes int64
	for id, g := range l.mu.groups {
		if g.id != id || g.removed {
			bad("group %d: id %d removed %v", id, g.id, g.removed)
		}
		if g.cursor > g.head {
			bad("group %d: cursor %d > head %d", id, g.cursor, g.head)
		}
		var resolved uint64
		for i, r := range g.resolved.r {
			if r.First > r.Last || r.First <= g.cursor+1 || r.Last > g.head || (i > 0 && r.First <= g.resolved.r[i-1].Last+1) {
				bad("group %d: resolved range %d %v (cursor %d head %d)", id, i, r, g.cursor, g.head)
			}
			resolved += r.Last - r.First + 1
		}
		var msgs, bytes uint64
		for i, r := range g.runs {
			if r.first > r.last || r.live == 0 || r.live > r.last-r.first+1 || r.last <= g.cursor || r.last > g.head || r.start >= r.end || r.end > r.seg.end {
				bad("group %d: run %d %+v (cursor %d head %d, segment end %d)", id, i, r, g.cursor, g.head, r.seg.end)
			}
			if i > 0 && r.first <= g.runs[i-1].last {
				bad("group %d: run %d overlaps the one before", id, i)
			}
			if r.seg.removed {
				bad("group %d: run %d in removed segment %d", id, i, r.seg.id)
			}
			msgs += r.live
			bytes += r.liveBytes
			segLive[r.seg] += r.live
		}
		if msgs != g.msgs || bytes != g.bytes {
			bad("group %d: msgs %d bytes %d, runs hold %d, %d", id, g.msgs, g.bytes, msgs, bytes)
		}
		if want := g.head - g.cursor - resolved; msgs != want {
			bad("group %d: %d live messages, want head %d - cursor %d - resolved %d = %d", id, msgs, g.head, g.cursor, resolved, want)
		}
		c := &g.cache
		var cb int64
		for i, e := range c.ents[c.h:] {
			if e.off != c.from+uint64(i) || e.off > g.head {
				bad("group %d: cache entry %d has offset %d (from %d head %d)", id, i, e.off, c.from, g.head)
			}
			cb += int64(len(e.data)) + entryOverhead
			if e.data != nil && (e.off <= g.cursor || g.resolved.contains(e.off)) {
				bad("group %d: cache holds resolved offset %d", id, e.off)
			}
		}
		if cb != c.bytes || (c.n() > 0) != (c.listed >= 0) || c.from > g.head+1 {
			bad("group %d: cache bytes %d, entries hold %d; listed %d; from %d head %d", id, c.bytes, cb, c.listed, c.from, g.head)
		}
		if c.listed >= 0 && (c.listed >= len(l.mu.cached) || l.mu.cached[c.listed] != g) {
			bad("group %d: cache listing %d is wrong", id, c.listed)
		}
		cacheBytes += c.bytes
	}
	if cacheBytes != l.mu.cacheBytes {
		bad("cache bytes %d, groups hold %d", l.mu.cacheBytes, cacheBytes)
	}
	if l.opts.CacheBytes > 0 && l.mu.cacheBytes > l.opts.CacheBytes {
		bad("cache bytes %d over the bound %d", l.mu.cacheBytes, l.opts.CacheBytes)
	}
	for i, s := range l.mu.segs {
		if s.live != segLive[s] {
			bad("segment %d: live %d, runs hold %d", s.id, s.live, segLive[s])
		}
		if s.live > s.msgRefs || s.end > s.size || s.end < s.base || s.removed {
			bad("segment %d: live %d references %d end %d size %d removed %v", s.id, s.live, s.msgRefs, s.end, s.size, s.removed)
		}
		if (i < len(l.mu.segs)-1) != s.sealed || (i > 0 && s.id <= l.mu.segs[i-1].id) {
			bad("segment %d at %d: sealed %v", s.id, i, s.sealed)
		}
		delete(segLive, s)
	}
	for s, n := range segLive {
		bad("segment %d (not listed) holds %d live records", s.id, n)
	}
	return errors.Join(errs...)
}
