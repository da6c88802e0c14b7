package seglog

import (
	"os"
	"slices"
)

// Snapshot is a consistent state of every group and the position of the log
// at one moment, taken by Checkpoint. The caller persists Groups (they are
// what Open takes back) and then calls Checkpointed.
type Snapshot struct {
	// Groups holds the state of every group.
	Groups map[uint64]GroupState
	// Segment and Position locate the end of the committed log at the
	// snapshot.
	Segment  uint64
	Position int64

	seq       uint64
	removable []uint64 // sealed segments without live records at the snapshot
}

// Checkpoint returns the state of every group. It includes resolutions not
// yet written to the log: persisting the snapshot makes them durable.
func (l *Log) Checkpoint() *Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.ckptSeq++
	s := &Snapshot{Groups: make(map[uint64]GroupState, len(l.mu.groups)), seq: l.mu.ckptSeq}
	for id, g := range l.mu.groups {
		s.Groups[id] = g.state()
	}
	act := l.active()
	s.Segment, s.Position = act.id, act.end
	for _, sg := range l.mu.segs {
		if sg.sealed && sg.live == 0 {
			s.removable = append(s.removable, sg.id)
		}
	}
	return s
}

// Checkpointed tells the log that s was persisted: the segments it made
// removable (sealed, without live records when s was taken; their resolve
// records are covered by s) are deleted. Snapshots must be persisted in the
// order they were taken; Checkpointed ignores one older than the last.
func (l *Log) Checkpointed(s *Snapshot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s == nil || s.seq <= l.mu.ckptDone || l.mu.closed || l.opts.ReadOnly {
		return
	}
	l.mu.ckptDone = s.seq
	for id, st := range s.Groups {
		if g := l.mu.groups[id]; g != nil {
			g.ckptCursor = max(g.ckptCursor, st.Cursor)
		}
	}
	for _, id := range s.removable {
		i := slices.IndexFunc(l.mu.segs, func(sg *segment) bool { return sg.id == id })
		if i < 0 {
			continue
		}
		sg := l.mu.segs[i]
		if !sg.sealed || sg.live != 0 || sg.compacting {
			continue
		}
		if err := os.Remove(sg.path); err != nil {
			l.log.Error("remove segment", "segment", id, "error", err)
			continue
		}
		l.mu.segs = slices.Delete(l.mu.segs, i, i+1)
		sg.removed = true
		if sg.pins == 0 {
			sg.f.Close()
		}
		l.stats.removed.Add(1)
	}
}

// copyRec is a live record the compactor copies forward, for the groups of
// refs whose copy in src is still live.
type copyRec struct {
	refs   []ref
	data   []byte
	src    *segment
	srcEnd int64
}

// runCompactor copies the live records of sparse sealed segments forward
// until Close.
func (l *Log) runCompactor() {
	defer l.wg.Done()
	if l.opts.CompactLiveRatio < 0 {
		return
	}
	for {
		select {
		case <-l.stop:
			return
		case <-l.wakeC:
		}
		for {
			s := l.pickCompaction()
			if s == nil {
				break
			}
			copied, ok := l.compact(s)
			l.mu.Lock()
			s.compacting = false
			if copied {
				s.compacted = true
			} else {
				s.surveyLive = max(s.live, 1)
			}
			l.mu.Unlock()
			if !ok {
				return
			}
			if copied {
				l.stats.compactions.Add(1)
			}
		}
	}
}

// pickCompaction returns the oldest sealed segment whose live references
// are fewer than CompactLiveRatio of its references (and, if the compactor
// looked at it before and kept it, half as many as then), marked
// compacting, or nil.
func (l *Log) pickCompaction() *segment {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.failed != nil {
		return nil
	}
	for _, s := range l.mu.segs {
		if s.sealed && !s.compacting && !s.compacted && s.live > 0 &&
			float64(s.live) < l.opts.CompactLiveRatio*float64(s.msgRefs) &&
			(s.surveyLive == 0 || s.live*2 <= s.surveyLive) {
			s.compacting = true
			return s
		}
	}
	return nil
}

// compact copies the live records of s through the writer, in chunks of at
// most 1 MiB (a quarter segment if less), in their order in s (so each
// group's offsets stay in order within a run). A record shared by several
// groups is live while one of them needs it, so s is first surveyed: if its
// live records still fill CompactLiveRatio of it, nothing is copied. It
// reports whether it copied, and false for ok if the log is closing or
// failed.
func (l *Log) compact(s *segment) (copied, ok bool) {
	liveBytes, ok := l.walkLive(s, nil)
	if !ok {
		return false, false
	}
	if float64(liveBytes) >= l.opts.CompactLiveRatio*float64(s.end-s.base) {
		return false, true
	}
	chunkMax := min(1<<20, int(l.opts.SegmentSize/4))
	var batch []copyRec
	bytes := 0
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		o := &op{kind: opCopy, copies: batch, ch: make(chan struct{})}
		for _, c := range batch {
			o.bound += msgFrameBound(len(c.data), len(c.refs))
		}
		batch, bytes = nil, 0
		if err := l.q.push(o); err != nil {
			return false
		}
		select {
		case <-o.ch:
			return o.err == nil
		case <-l.stop:
			return false
		}
	}
	_, ok = l.walkLive(s, func(c copyRec) bool {
		// A chunk stays within chunkMax, or is one record (which fits in a segment).
		n := msgFrameBound(len(c.data), len(c.refs))
		if bytes > 0 && bytes+n > chunkMax && !flush() {
			return false
		}
		c.data = append([]byte(nil), c.data...)
		batch = append(batch, c)
		bytes += n
		return true
	})
	return true, ok && flush()
}

// walkLive walks the records of s that some group's index points at,
// passing each (its data valid during the call) with the references live
// in s to fn (nil: just count), and returns the frame bytes of those
// records. A damaged stretch is skipped (its records stay where they are;
// ReadFrom resolves them as lost). ok is false if fn returned false.
func (l *Log) walkLive(s *segment, fn func(copyRec) bool) (liveBytes int64, ok bool) {
	l.mu.Lock()
	end := s.end
	l.mu.Unlock()
	w := newWalker(s.f, s.version, end)
	for pos := s.base; pos < end; {
		fr, err := w.at(pos)
		if err != nil || fr.st == frameEnd {
			break
		}
		if fr.st != frameOK {
			next, err := w.resync(fr)
			if err != nil || next < 0 {
				break
			}
			if fn != nil {
				l.log.Error("compaction skipped a damaged stretch", "segment", s.id, "pos", pos, "bytes", next-pos)
			}
			pos = next
			continue
		}
		rec, _ := decodeBody(fr.body) // checked by at
		if isMessage(rec.typ) {
			if refs := l.liveRefs(s, &rec); len(refs) > 0 {
				liveBytes += fr.end - pos
				if fn != nil && !fn(copyRec{refs: refs, data: rec.msg, src: s, srcEnd: fr.end}) {
					return liveBytes, false
				}
			}
		}
		pos = fr.end
	}
	return liveBytes, true
}

// liveRefs returns the references of rec whose offsets the index places in s.
func (l *Log) liveRefs(s *segment, rec *record) []ref {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ref
	it := rec.refs()
	for x, ok := it.next(); ok; x, ok = it.next() {
		g := l.mu.groups[x.group]
		if g == nil || x.offset <= g.cursor || g.resolved.contains(x.offset) {
			continue
		}
		if i := g.findRun(x.offset); i >= 0 && g.runs[i].seg == s {
			out = append(out, x)
		}
	}
	return out
}
