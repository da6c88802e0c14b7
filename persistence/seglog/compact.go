package seglog

import (
	"cmp"
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
	if s == nil || s.seq <= l.mu.ckptDone || l.mu.closed {
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
		if sg.refs == 0 {
			sg.f.Close()
		}
		l.stats.removed.Add(1)
	}
}

// copyRec is a live record the compactor copies forward.
type copyRec struct {
	group, offset uint64
	data          []byte
	src           *segment
	srcEnd        int64
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
			ok := l.compact(s)
			l.mu.Lock()
			s.compacting, s.compacted = false, true
			l.mu.Unlock()
			if !ok {
				return
			}
			l.stats.compactions.Add(1)
		}
	}
}

// pickCompaction returns the oldest sealed segment whose live records are
// fewer than CompactLiveRatio of its records (marked compacting and
// pinned), or nil.
func (l *Log) pickCompaction() *segment {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.failed != nil {
		return nil
	}
	for _, s := range l.mu.segs {
		if s.sealed && !s.compacting && !s.compacted && s.live > 0 && float64(s.live) < l.opts.CompactLiveRatio*float64(s.records) {
			s.compacting = true
			return s
		}
	}
	return nil
}

// compact copies the live records of s through the writer, in chunks of at
// most 1 MiB (a quarter segment if less), each sorted by group and offset. It reports false if
// the log is closing or failed.
func (l *Log) compact(s *segment) bool {
	chunkMax := min(1<<20, int(l.opts.SegmentSize/4))
	sc := scanner{f: s.f, size: s.end}
	var batch []copyRec
	bytes := 0
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		slices.SortFunc(batch, func(a, b copyRec) int {
			return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(a.offset, b.offset))
		})
		o := &op{kind: opCopy, copies: batch, ch: make(chan struct{})}
		for _, c := range batch {
			o.bound += msgFrameBound(len(c.data))
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
	for pos := int64(0); pos < s.end; {
		h, err := sc.at(pos, frameHeader)
		if err != nil {
			break
		}
		n, crc, st := parseHeader(h)
		if st != frameOK {
			break
		}
		body, err := sc.at(pos+frameHeader, n)
		if err != nil || !checkCRC(body, crc) {
			// Damaged since it was written: its live records stay where they
			// are (ReadFrom reports the damage); nothing garbled is copied.
			l.log.Error("compaction stopped at a bad frame", "segment", s.id, "pos", pos, "error", err)
			break
		}
		end := pos + frameHeader + int64(n)
		rec, err := decodeBody(body)
		if err == nil && (rec.typ == recMessage || rec.typ == recMoved) && l.liveIn(s, rec.group, rec.offset) {
			// A chunk stays within chunkMax, or is one record (which fits in a segment).
			if bytes > 0 && bytes+msgFrameBound(len(rec.msg)) > chunkMax && !flush() {
				return false
			}
			data := append([]byte(nil), rec.msg...)
			batch = append(batch, copyRec{group: rec.group, offset: rec.offset, data: data, src: s, srcEnd: end})
			bytes += msgFrameBound(len(data))
		}
		pos = end
	}
	return flush()
}

// liveIn reports whether the index points at the record of off in s.
func (l *Log) liveIn(s *segment, id, off uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.mu.groups[id]
	if g == nil || off <= g.cursor || g.resolved.contains(off) {
		return false
	}
	i := g.findRun(off)
	return i >= 0 && g.runs[i].seg == s
}
