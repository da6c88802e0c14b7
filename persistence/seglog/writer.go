package seglog

import (
	"fmt"
	"time"
)

// writer is the state of the writer goroutine, the only one that writes
// segment files.
type writer struct {
	seg   *segment // the active segment
	end   int64    // its write position (== seg.end between commits)
	ops   []*op
	carry []*op // ops cut from the last batch because the segment filled
	buf   []byte
	recs  []stagedRec
	refs  []stagedRef // the references of recs
	tmp   []ref       // one record's references, as appendMsgFrame takes them
	res   []stagedResolve
	rbuf  []Range // ranges of res
	touch []*group
	fail  error // ErrFailed once a write or fdatasync failed

	// What gather weighs (moving averages, 1/8 per sample): the gap between
	// appends as they were queued, and what a commit's write and fdatasync
	// take. While appends arrive more than half a commit's time apart, a
	// commit gains nothing by waiting for the next one.
	lastAt    time.Time
	gap, cost time.Duration
}

// stagedRec is one message or moved record of the batch: one copy of data
// for the groups of refs[from:to].
type stagedRec struct {
	typ      byte
	from, to int
	data     []byte
	pos, end int // frame bounds in buf
	src      *segment
	srcEnd   int64 // moved: end of the original record in src
}

// stagedRef is one group's offset in a staged record.
type stagedRef struct {
	g   *group
	off uint64
}

// stagedResolve is one resolve record of the batch: ranges rbuf[from:to].
type stagedResolve struct {
	g        *group
	from, to int
	batch    bool // drop-oldest of offsets assigned in this batch
}

// runWriter takes batches from the queue and commits them until the queue
// is closed and drained.
func (l *Log) runWriter() {
	defer l.wg.Done()
	w := &l.w
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	released := 0         // appenders the last commit answered
	var lastEnd time.Time // when it ended
	for {
		ops, closed := l.q.take(append(w.ops[:0], w.carry...))
		w.ops, w.carry = ops, w.carry[:0]
		if len(ops) == 0 {
			l.mu.Lock()
			pending, since := len(l.mu.pendingGroups) > 0, l.mu.pendingSince
			l.mu.Unlock()
			wait := time.Until(since.Add(l.opts.ResolveDelay))
			switch {
			case pending && (closed || wait <= 0):
				l.commit(nil)
				continue
			case closed:
				return
			case pending:
				timer.Reset(wait)
				select {
				case <-l.q.wake:
				case <-timer.C:
				}
				timer.Stop()
			default:
				<-l.q.wake
			}
			continue
		}
		if !closed && w.fail == nil {
			w.ops = l.gather(ops, released, lastEnd, timer)
			ops = w.ops
		}
		released = l.commit(ops)
		lastEnd = time.Now()
	}
}

// commit writes one batch: ops (possibly cut short where the segment fills;
// the rest is carried to the next batch) and the pending resolutions, in one
// write and one fdatasync, then publishes the new state and hands the
// callbacks to the notifier. It returns the number of callbacks released.
func (l *Log) commit(ops []*op) int {
	w := &l.w
	if w.fail == nil {
		need := resolveFrameBound(1)
		if len(ops) > 0 && ops[0].err == nil {
			need = ops[0].bound + resolveFrameBound(1)
		}
		// A segment of an older format is never written: the first commit
		// after Open moves on to a new one.
		if w.seg.version < FormatVersion || (w.seg.size-w.end < int64(need) && w.end > w.seg.base) {
			if err := l.roll(); err != nil {
				for _, o := range ops {
					o.err = err
				}
				return l.finish(ops, nil)
			}
		}
	}
	l.mu.Lock()
	if w.fail != nil {
		for _, g := range l.mu.pendingGroups {
			g.pendingListed = false
		}
		clear(l.mu.pendingGroups)
		l.mu.pendingGroups = l.mu.pendingGroups[:0]
		l.mu.Unlock()
		for _, o := range ops {
			o.err = w.fail
		}
		return l.finish(ops, nil)
	}
	room := int(w.seg.size - w.end)
	used := 0
	for i, o := range ops {
		b := o.bound
		if o.err != nil {
			b = 0
		}
		if i > 0 && used+b+resolveFrameBound(1) > room {
			w.carry = append(w.carry, ops[i:]...)
			clear(ops[i:])
			ops = ops[:i]
			break
		}
		used += b
		l.assignLocked(o)
	}
	l.takeResolvesLocked(room - used)
	if len(l.mu.pendingGroups) > 0 {
		// Resolutions left for lack of room: a Sync waits for the next commit.
		kept := ops[:0]
		var syncs []*op
		for _, o := range ops {
			if o.kind == opSync {
				syncs = append(syncs, o)
			} else {
				kept = append(kept, o)
			}
		}
		if len(syncs) > 0 {
			clear(ops[len(kept):])
			ops = kept
			w.carry = append(syncs, w.carry...)
		}
	}
	l.mu.Unlock()

	w.buf = w.buf[:0]
	for i := range w.recs {
		r := &w.recs[i]
		r.pos = len(w.buf)
		w.tmp = w.tmp[:0]
		for _, x := range w.refs[r.from:r.to] {
			w.tmp = append(w.tmp, ref{x.g.id, x.off})
		}
		w.buf = appendMsgFrame(w.buf, r.typ, w.tmp, r.data)
		r.end = len(w.buf)
	}
	for _, r := range w.res {
		w.buf = appendResolveFrame(w.buf, r.g.id, w.rbuf[r.from:r.to])
	}
	if err := l.write(); err != nil {
		l.stats.commitFailures.Add(1)
		w.fail = fmt.Errorf("%w: %s: %w", ErrFailed, w.seg.path, err)
		l.log.Error("commit failed; the log stops writing", "error", err)
		l.mu.Lock()
		l.mu.failed = w.fail
		for _, g := range l.mu.pendingGroups {
			g.pendingListed = false // they cannot be written any more
		}
		clear(l.mu.pendingGroups)
		l.mu.pendingGroups = l.mu.pendingGroups[:0]
		for _, g := range w.touch {
			g.touched = false
			g.assigned = g.head
		}
		l.mu.Unlock()
		w.touch, w.recs, w.refs, w.res = w.touch[:0], w.recs[:0], w.refs[:0], w.res[:0]
		for _, o := range ops {
			o.err = w.fail
		}
		return l.finish(ops, nil)
	}
	heads := l.publish()
	if len(ops) == 0 && len(w.res) > 0 {
		l.stats.resolveCommits.Add(1)
	}
	w.recs, w.refs, w.res, w.rbuf = w.recs[:0], w.refs[:0], w.res[:0], w.rbuf[:0]
	return l.finish(ops, heads)
}

// write writes the batch's frames at the end of the active segment and
// makes them durable.
func (l *Log) write() error {
	w := &l.w
	if len(w.buf) == 0 {
		return nil
	}
	start := time.Now()
	defer func() {
		took := time.Since(start)
		l.stats.writeNanos.Add(uint64(took))
		w.cost = ewma(w.cost, took)
	}()
	if _, err := w.seg.f.WriteAt(w.buf, w.end); err != nil {
		return err
	}
	l.stats.commits.Add(1)
	l.stats.bytes.Add(uint64(len(w.buf)))
	l.stats.records.Add(uint64(len(w.recs) + len(w.res)))
	l.stats.resolveRecs.Add(uint64(len(w.res)))
	if l.opts.NoSync {
		return nil
	}
	l.stats.syncs.Add(1)
	return fdatasync(w.seg.f)
}

// roll seals the active segment and continues in the prepared spare.
func (l *Log) roll() error {
	w := &l.w
	pr := <-l.prep.ready
	if pr.err != nil {
		// The background preparation failed (a full disk, say): try once
		// more now, so that a roll after the cause is gone does not meet a
		// stale failure. Only this error path waits for zero-filling.
		id := w.seg.id + 1
		s, err := createSegment(l.opts.Dir, id, l.opts.SegmentSize, l.opts.NoSync)
		if err != nil {
			l.prep.req <- id // and again in the background for the next roll
			err = fmt.Errorf("seglog: prepare segment %d: %w", id, err)
			l.log.Error("no segment to roll to", "error", err)
			return err
		}
		pr = prepared{seg: s}
	}
	l.mu.Lock()
	w.seg.sealed = true
	l.mu.segs = append(l.mu.segs, pr.seg)
	l.mu.Unlock()
	w.seg, w.end = pr.seg, pr.seg.base
	l.prep.req <- pr.seg.id + 1
	l.wakeCompactor()
	return nil
}

// assignLocked assigns offsets to an append op (applying limits) or stages
// the records of a copy op.
func (l *Log) assignLocked(o *op) {
	w := &l.w
	if o.err != nil {
		return
	}
	switch o.kind {
	case opAppend:
		size := uint64(len(o.msg))
		from := len(w.refs)
		for j, id := range o.groups {
			g := l.mu.groups[id]
			if g == nil {
				o.res[j] = Result{Err: fmt.Errorf("%w: %d", ErrGroupNotFound, id)}
				continue
			}
			l.touchLocked(g)
			if err := l.admitLocked(g, size); err != nil {
				o.res[j] = Result{Err: err}
				continue
			}
			g.assigned++
			g.batchSizes = append(g.batchSizes, size)
			g.batchKeptB += size
			o.res[j] = Result{Offset: g.assigned}
			w.refs = append(w.refs, stagedRef{g, g.assigned})
		}
		if len(w.refs) > from { // one copy for every group that took it
			w.recs = append(w.recs, stagedRec{typ: recShared, from: from, to: len(w.refs), data: o.msg})
		}
	case opCopy:
		for _, c := range o.copies {
			from := len(w.refs)
			for _, x := range c.refs {
				if g := l.mu.groups[x.group]; g != nil {
					w.refs = append(w.refs, stagedRef{g, x.offset})
				}
			}
			if len(w.refs) > from {
				w.recs = append(w.recs, stagedRec{typ: recSharedMoved, from: from, to: len(w.refs), data: c.data, src: c.src, srcEnd: c.srcEnd})
			}
		}
	}
}

func (l *Log) touchLocked(g *group) {
	if g.touched {
		return
	}
	g.touched = true
	g.batchFirst = g.assigned + 1
	g.batchSizes, g.batchDrop, g.batchKeptB = g.batchSizes[:0], 0, 0
	l.w.touch = append(l.w.touch, g)
}

// admitLocked applies the group's limits to a message of size bytes: it
// fails with ErrBacklogFull, or under DropOldest resolves the oldest
// unresolved messages (committed ones, then ones of this batch) until the
// message fits.
func (l *Log) admitLocked(g *group, size uint64) error {
	lim := g.lim
	if lim.TooLarge(size) {
		g.refused++
		return fmt.Errorf("%w: group %d: message of %d bytes exceeds the limit of %d bytes", ErrBacklogFull, g.id, size, lim.MaxBytes)
	}
	over := func() bool {
		return lim.Over(g.msgs+uint64(len(g.batchSizes)-g.batchDrop), g.bytes+g.batchKeptB, size)
	}
	if !over() {
		return nil
	}
	if !lim.DropOldest {
		g.refused++
		return fmt.Errorf("%w: group %d holds %d messages, %d bytes (limits %d messages, %d bytes)",
			ErrBacklogFull, g.id, g.msgs+uint64(len(g.batchSizes)-g.batchDrop), g.bytes+g.batchKeptB, lim.MaxMessages, lim.MaxBytes)
	}
	for over() {
		switch {
		case g.msgs > 0 && g.cursor < g.head:
			if !l.resolveLocked(g, g.cursor+1, false) {
				return fmt.Errorf("seglog: group %d: offset %d after the cursor is resolved", g.id, g.cursor+1)
			}
			g.advanceLocked()
		case g.batchDrop < len(g.batchSizes):
			g.batchKeptB -= g.batchSizes[g.batchDrop]
			g.batchDrop++
		default:
			return nil // cannot happen: an empty group takes any message within MaxBytes
		}
		g.dropped++
	}
	return nil
}

// takeResolvesLocked moves pending resolutions (and this batch's drops) into
// resolve records of the batch, as many as fit in room bytes.
func (l *Log) takeResolvesLocked(room int) {
	w := &l.w
	for _, g := range w.touch {
		if g.batchDrop > 0 {
			from := len(w.rbuf)
			w.rbuf = append(w.rbuf, Range{g.batchFirst, g.batchFirst + uint64(g.batchDrop) - 1})
			w.res = append(w.res, stagedResolve{g: g, from: from, to: len(w.rbuf), batch: true})
			room -= resolveFrameBound(1)
		}
	}
	i := 0
	for ; i < len(l.mu.pendingGroups); i++ {
		g := l.mu.pendingGroups[i]
		if g.removed {
			g.pendingListed = false
			continue
		}
		k := min(g.pending.len(), maxResolveRanges, (room-resolveFrameBound(0))/(resolveFrameBound(1)-resolveFrameBound(0)))
		if k <= 0 {
			break
		}
		from := len(w.rbuf)
		w.rbuf = append(w.rbuf, g.pending.r[:k]...)
		w.res = append(w.res, stagedResolve{g: g, from: from, to: len(w.rbuf)})
		room -= resolveFrameBound(k)
		if g.inflightMin == 0 || g.pending.r[0].First < g.inflightMin {
			g.inflightMin = g.pending.r[0].First
		}
		for _, r := range g.pending.r[:k] {
			g.inflightCount += r.Last - r.First + 1
		}
		g.pending.r = append(g.pending.r[:0], g.pending.r[k:]...)
		if !g.pending.empty() {
			break
		}
		g.pendingListed = false
	}
	n := copy(l.mu.pendingGroups, l.mu.pendingGroups[i:])
	clear(l.mu.pendingGroups[n:])
	l.mu.pendingGroups = l.mu.pendingGroups[:n]
	if n == 0 {
		l.mu.pendingSince = time.Time{}
		if l.mu.resolveTimer != nil {
			l.mu.resolveTimer.Stop()
		}
	}
}

// publish makes the written batch visible: heads, index, cache, segment
// counters. It returns the groups whose head moved, for OnAppend.
func (l *Log) publish() []groupHead {
	w := &l.w
	base := w.end
	seg := w.seg
	var heads []groupHead
	l.mu.Lock()
	for i := range w.recs {
		r := &w.recs[i]
		size := uint64(len(r.data))
		pos, end := base+int64(r.pos), base+int64(r.end)
		seg.records++
		for _, x := range w.refs[r.from:r.to] {
			g, off := x.g, x.off
			seg.msgRefs++
			if g.removed {
				continue
			}
			switch r.typ {
			case recShared:
				g.head = off
				l.stats.appends.Add(1)
				if off < g.batchFirst+uint64(g.batchDrop) { // dropped in its own batch
					g.resolved.add(off)
					l.cachePushLocked(g, off, nil)
					continue
				}
				g.indexLocked(off, seg, pos, end, size)
				l.cachePushLocked(g, off, r.data)
			case recSharedMoved:
				l.moveLocked(g, off, r, seg, pos, end)
			}
		}
	}
	for _, r := range w.res {
		seg.records++
		r.g.inflightMin, r.g.inflightCount = 0, 0 // one commit at a time: its resolutions are durable now
	}
	for _, g := range w.touch {
		g.touched = false
		g.assigned = g.head
		if g.removed {
			continue
		}
		g.advanceLocked()
		if g.head >= g.batchFirst {
			heads = append(heads, groupHead{g.id, g.head})
		}
	}
	w.touch = w.touch[:0]
	w.end += int64(len(w.buf))
	seg.end = w.end
	l.mu.Unlock()
	return heads
}

// moveLocked points the index of g's offset off at the moved copy r (at
// pos..end of seg) if the original is still live in r.src and every offset
// of its run before it was copied before it or is resolved; otherwise the
// copy is garbage (for g).
func (l *Log) moveLocked(g *group, off uint64, r *stagedRec, seg *segment, pos, end int64) {
	i := g.findRun(off)
	if i < 0 || g.runs[i].seg != r.src || off <= g.cursor || g.resolved.contains(off) {
		return
	}
	run := &g.runs[i]
	if lo := max(run.first, g.cursor+1); lo < off && !g.resolved.covers(lo, off-1) {
		return
	}
	size := uint64(len(r.data))
	first, last, srcEnd := off+1, run.last, r.srcEnd
	g.unindexLocked(i, size, true)
	if first <= last && i < len(g.runs) && g.runs[i].first <= off {
		g.runs[i].first, g.runs[i].start = first, srcEnd
	}
	g.indexLocked(off, seg, pos, end, size)
	l.stats.moved.Add(1)
}

type groupHead struct{ group, head uint64 }

// finish hands the batch's completions to the notifier: callbacks in
// submission order, then OnAppend, then the syncs. It returns the number of
// append callbacks.
func (l *Log) finish(ops []*op, heads []groupHead) int {
	released := 0
	var done, syncs []*op
	for _, o := range ops {
		switch {
		case o.kind == opCopy || (o.kind == opSync && o.durableOnly):
			close(o.ch)
			continue
		case o.kind == opAppend && o.err != nil:
			o.fail(o.err)
		}
		if o.kind == opSync {
			syncs = append(syncs, o)
			continue
		}
		if o.done != nil {
			released++
		}
		done = append(done, o)
	}
	if len(done) == 0 && len(syncs) == 0 && len(heads) == 0 {
		return 0
	}
	onAppend, after := l.opts.OnAppend, l.opts.AfterCallbacks
	l.notify.Push(func() {
		for _, o := range done {
			if o.done != nil {
				o.done(o.res)
			}
			putAppendOp(o)
		}
		if onAppend != nil {
			for _, h := range heads {
				onAppend(h.group, h.head)
			}
		}
		if after != nil {
			after()
		}
		for _, o := range syncs {
			close(o.ch)
		}
	})
	return released
}
