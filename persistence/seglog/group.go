package seglog

import (
	"sort"
	"time"
)

// run is a stretch of one group's offsets first..last whose unresolved
// messages all live in one segment, between byte positions start and end;
// within a run, positions increase with offsets. Every offset of
// first..last is either live in this run or resolved, so runs of a group
// never overlap.
type run struct {
	first, last uint64
	seg         *segment
	start, end  int64
	// live counts the unresolved messages of the run; a run with none is removed.
	live uint64
	// liveBytes is the size of those messages. Resolving a message whose size
	// is unknown (no longer cached) subtracts the average liveBytes/live, and
	// the last one takes the rest, so it never goes negative and reaches 0
	// exactly with live.
	liveBytes uint64
}

// group is one group's state, guarded by Log.mu unless noted.
type group struct {
	id      uint64
	lim     Limits
	removed bool // dropped: the writer ignores its staged records

	// head is the highest committed offset; cursor <= head, and every offset
	// <= cursor is resolved. resolved holds the resolved offsets above
	// cursor; its first range never starts at cursor+1 (the cursor advances
	// over it).
	head, cursor uint64
	resolved     rangeSet
	// pending holds resolutions not yet taken by the writer; inflightMin is
	// the lowest offset of the resolve records of the commit being written
	// (0: none); ckptCursor is the cursor of the last persisted checkpoint.
	pending       rangeSet
	pendingListed bool
	inflightMin   uint64
	// inflightCount is the number of offsets in the resolve records of the
	// commit being written.
	inflightCount uint64
	ckptCursor    uint64

	// runs index the unresolved messages, sorted by first, disjoint.
	runs []run
	// msgs and bytes count the unresolved indexed messages (sum of the runs).
	msgs, bytes      uint64
	dropped, refused uint64
	// lost counts offsets resolved because their record was damaged or gone.
	lost uint64

	cache tailCache
	hint  readHint

	// Owned by the writer goroutine: the staged batch state.
	assigned   uint64   // last offset assigned (== head between commits)
	batchFirst uint64   // first offset assigned in the current batch
	batchSizes []uint64 // sizes of the offsets assigned in the batch, in order
	batchDrop  int      // how many of them drop-oldest dropped (a prefix)
	batchKeptB uint64   // bytes of the kept ones
	touched    bool     // in the writer's touched list
}

// readHint remembers where the last disk read of the group stopped: the
// record of offset off in seg ends at pos.
type readHint struct {
	seg *segment
	off uint64
	pos int64
}

func newGroup(id uint64, st GroupState, lim Limits) *group {
	g := &group{id: id, lim: lim, head: st.Head, cursor: min(st.Cursor, st.Head), dropped: st.Dropped, lost: st.Lost}
	g.ckptCursor = g.cursor
	for _, r := range st.Resolved {
		if r.First > r.Last || r.Last <= g.cursor {
			continue
		}
		g.resolved.addRange(max(r.First, g.cursor+1), r.Last)
	}
	g.advanceLocked()
	g.assigned = g.head
	g.cache.from = g.head + 1
	g.cache.listed = -1
	return g
}

// state returns the group's state for a checkpoint.
func (g *group) state() GroupState {
	return GroupState{Head: g.head, Cursor: g.cursor, Resolved: g.resolved.ranges(), Dropped: g.dropped, Lost: g.lost}
}

// durableCursor returns the highest cursor no crash can take back.
func (g *group) durableCursor() uint64 {
	c := g.cursor
	if !g.pending.empty() {
		c = min(c, g.pending.first().First-1)
	}
	if g.inflightMin != 0 {
		c = min(c, g.inflightMin-1)
	}
	return max(c, g.ckptCursor)
}

// advanceLocked moves the cursor over the resolved offsets that follow it.
func (g *group) advanceLocked() {
	for {
		r, ok := g.resolved.popFrontIf(g.cursor + 1)
		if !ok {
			return
		}
		g.cursor = r.Last
	}
}

// findRun returns the index of the run whose range holds off, or -1.
func (g *group) findRun(off uint64) int {
	n := len(g.runs)
	if n == 0 {
		return -1
	}
	if r := &g.runs[0]; r.first <= off && off <= r.last { // acks arrive almost in order
		return 0
	}
	if r := &g.runs[n-1]; r.first <= off && off <= r.last {
		return n - 1
	}
	i := sort.Search(n, func(i int) bool { return g.runs[i].last >= off })
	if i < n && g.runs[i].first <= off {
		return i
	}
	return -1
}

// indexLocked adds the live record of off (size bytes, at pos..end of seg) to
// the index: it extends the run before it when that run is in the same
// segment, ends before pos, no run lies between, and every offset between
// is resolved; otherwise it inserts a run.
func (g *group) indexLocked(off uint64, seg *segment, pos, end int64, size uint64) {
	seg.live++
	g.msgs++
	g.bytes += size
	n := len(g.runs)
	i := n // insertion point: first run with first > off
	if n > 0 && g.runs[n-1].first > off {
		i = sort.Search(n, func(i int) bool { return g.runs[i].first > off })
	}
	if i > 0 {
		r := &g.runs[i-1]
		if r.seg == seg && r.last < off && r.end <= pos && (r.last+1 == off || g.resolved.covers(r.last+1, off-1)) {
			r.last, r.end = off, end
			r.live++
			r.liveBytes += size
			return
		}
	}
	g.runs = append(g.runs, run{})
	copy(g.runs[i+1:], g.runs[i:])
	g.runs[i] = run{first: off, last: off, seg: seg, start: pos, end: end, live: 1, liveBytes: size}
}

// unindexLocked removes the live message off from run i; size is its exact
// size if known, else 0 with known false.
func (g *group) unindexLocked(i int, size uint64, known bool) {
	r := &g.runs[i]
	sub := r.liveBytes
	if r.live > 1 {
		if known {
			sub = min(size, r.liveBytes)
		} else {
			sub = r.liveBytes / r.live
		}
	}
	r.live--
	r.liveBytes -= sub
	r.seg.live--
	g.msgs--
	g.bytes -= min(sub, g.bytes)
	if r.live == 0 {
		g.runs = append(g.runs[:i], g.runs[i+1:]...)
	}
}

// resolveLocked marks off resolved; it reports whether off was unresolved
// and at most head. With durable unset the resolution also goes into
// pending, to be written by the writer. It does not advance the cursor.
func (l *Log) resolveLocked(g *group, off uint64, durable bool) bool {
	if off <= g.cursor || off > g.head || !g.resolved.add(off) {
		return false
	}
	if !durable {
		g.pending.add(off)
		if !g.pendingListed {
			if len(l.mu.pendingGroups) == 0 {
				l.mu.pendingSince = time.Now()
			}
			g.pendingListed = true
			l.mu.pendingGroups = append(l.mu.pendingGroups, g)
		}
	}
	size, known := l.cacheForgetLocked(g, off)
	if i := g.findRun(off); i >= 0 {
		g.unindexLocked(i, size, known)
	}
	return true
}
