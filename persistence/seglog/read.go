package seglog

import (
	"fmt"
)

// readChunk is the size of one pread of ReadFrom and the compactor.
const readChunk = 256 << 10

// readPlan is one run to read from disk: the records of group with offsets
// lo..hi between byte positions start and end of seg (pinned).
type readPlan struct {
	seg        *segment
	lo, hi     uint64
	runFirst   uint64
	start, end int64
}

// ReadFrom appends to buf up to max unresolved entries of the group with
// offsets >= from, ascending, and returns buf. Entries come from the tail
// cache, or from disk for offsets below it; ReadFrom drops the cache entries
// it passes (a reader never reads below what it read, except a fresh reader
// after a restart, which reads from disk). The entries' Data must not be
// modified.
func (l *Log) ReadFrom(id, from uint64, max int, buf []Entry) ([]Entry, error) {
	var plans []readPlan
	var skip []Range
	l.mu.Lock()
	defer l.mu.Unlock()
	for n := 0; n < max; {
		if l.mu.closed {
			return buf, ErrClosed
		}
		g := l.mu.groups[id]
		if g == nil {
			return buf, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
		}
		if from <= g.cursor {
			from = g.cursor + 1
		}
		if from > g.head {
			return buf, nil
		}
		if from >= g.cache.from {
			buf, _ = l.cacheReadLocked(g, from, max-n, buf)
			return buf, nil
		}
		// From disk: the runs that hold offsets from..cache.from-1.
		hi := g.cache.from - 1
		plans, skip = l.planLocked(g, from, hi, plans[:0], skip[:0])
		if len(plans) == 0 {
			from = hi + 1 // nothing unresolved below the cache
			continue
		}
		hint := g.hint
		l.mu.Unlock()
		got, last, hintOut, lost, err := l.readPlans(plans, hint, id, from, max-n, skip, buf)
		l.mu.Lock()
		for _, p := range plans {
			l.unpinLocked(p.seg)
		}
		if err != nil {
			return buf, err
		}
		// Keep what is still unresolved (resolutions may have arrived meanwhile).
		g = l.mu.groups[id]
		if g == nil {
			return buf, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
		}
		if len(lost) > 0 {
			// Damaged records: resolved as lost (durably with the next
			// commit), so the group goes on without them.
			wasPending := len(l.mu.pendingGroups) > 0
			l.loseLocked(g, lost)
			g.advanceLocked()
			if !wasPending && len(l.mu.pendingGroups) > 0 {
				l.q.signal()
			}
		}
		kept := got[:len(buf)]
		for _, e := range got[len(buf):] {
			if e.Offset > g.cursor && !g.resolved.contains(e.Offset) {
				kept = append(kept, e)
			}
		}
		l.stats.cacheMisses.Add(uint64(len(kept) - len(buf)))
		n += len(kept) - len(buf)
		buf = kept
		if hintOut.seg != nil {
			g.hint = hintOut
		}
		if last >= hi {
			from = hi + 1
		} else {
			from = last + 1
		}
	}
	return buf, nil
}

// planLocked lists the runs holding offsets from..hi (pinning their
// segments), and the resolved ranges within from..hi to skip (a bounded
// number: the caller filters again).
func (l *Log) planLocked(g *group, from, hi uint64, plans []readPlan, skip []Range) ([]readPlan, []Range) {
	i := g.findRun(from)
	if i < 0 {
		i = len(g.runs)
		for j := range g.runs {
			if g.runs[j].first > from {
				i = j
				break
			}
		}
	}
	for ; i < len(g.runs) && g.runs[i].first <= hi && len(plans) < 8; i++ {
		r := &g.runs[i]
		p := readPlan{seg: r.seg, lo: max(r.first, from), hi: min(r.last, hi), runFirst: r.first, start: r.start, end: r.end}
		l.pinLocked(r.seg)
		plans = append(plans, p)
	}
	for j := g.resolved.find(from); j < g.resolved.len() && g.resolved.r[j].First <= hi && len(skip) < 256; j++ {
		skip = append(skip, g.resolved.r[j])
	}
	return plans, skip
}

func (l *Log) pinLocked(s *segment) { s.pins++ }

func (l *Log) unpinLocked(s *segment) {
	s.pins--
	if s.pins == 0 && s.removed {
		s.f.Close()
	}
}

// readPlans reads the planned runs in order and appends up to max records
// of group with offsets >= from (up to limit), strictly ascending, not in skip. It returns
// the highest offset it looked at (so the caller can go on after it), a
// read hint for the next call, and the offsets of group whose records it
// found damaged (resolve them as lost: the group goes on without them).
// Damaged bytes are copied to quarantine; the next good frame is found by
// resync.
func (l *Log) readPlans(plans []readPlan, hint readHint, group, from uint64, limit int, skip []Range, buf []Entry) ([]Entry, uint64, readHint, []Range, error) {
	var out readHint
	var lost []Range
	last := from - 1
	for _, p := range plans {
		pos := p.start
		if hint.seg == p.seg && p.runFirst <= hint.off && hint.off < from && pos < hint.pos && hint.pos <= p.end {
			pos = hint.pos // the records of offsets > hint.off follow it
		}
		hl := frameHeaderLen(p.seg.version)
		// gap is set after damage: the group's offsets from gapFrom up to the
		// next of its records found are lost.
		gap, gapFrom := false, uint64(0)
		var chunk []byte
		var chunkAt int64
		for pos < p.end && limit > 0 {
			if pos < chunkAt || pos+int64(hl) > chunkAt+int64(len(chunk)) {
				var err error
				if chunk, err = readAt(p.seg, pos, min(readChunk, p.end-pos)); err != nil {
					return buf, last, out, lost, err
				}
				chunkAt = pos
			}
			rel := int(pos - chunkAt)
			n, crc, st := parseHeader(chunk[rel:], p.seg.version, p.end-pos)
			var rec record
			end := pos + int64(hl) + int64(n)
			if st == frameOK && rel+hl+n > len(chunk) {
				var err error
				if chunk, err = readAt(p.seg, pos, max(int64(hl+n), min(readChunk, p.end-pos))); err != nil {
					return buf, last, out, lost, err
				}
				chunkAt, rel = pos, 0
			}
			if st == frameOK {
				body := chunk[rel+hl : rel+hl+n]
				var err error
				if !checkCRC(body, crc) {
					st = frameBad
				} else if rec, err = decodeBody(body); err != nil {
					st = frameBad
				}
			}
			if st != frameOK {
				bad := frame{pos: pos, st: st}
				if n > 0 {
					bad.end = end
				}
				next, err := newWalker(p.seg.f, p.seg.version, p.end).resync(bad)
				if err != nil {
					return buf, last, out, lost, fmt.Errorf("seglog: segment %d at %d: %w", p.seg.id, pos, err)
				}
				if next < 0 {
					next = p.end
				}
				l.stats.damaged.Add(1)
				name, _ := l.copyToQuarantine(p.seg, pos, next-pos, "damaged while in use")
				l.log.Error("damaged segment read: the group's records in it are lost", "segment", p.seg.id, "pos", pos, "bytes", next-pos, "group", group, "quarantined", name)
				if !gap {
					gap, gapFrom = true, max(last+1, p.lo)
				}
				pos = next
				continue
			}
			if isMessage(rec.typ) {
				if off, ok := rec.offsetOf(group); ok && off >= p.lo && off <= p.hi && off > last {
					if gap {
						if off > gapFrom {
							lost = append(lost, Range{gapFrom, off - 1})
						}
						gap = false
					}
					last = off
					out = readHint{seg: p.seg, off: off, pos: end}
					if !inRanges(skip, off) {
						buf = append(buf, Entry{Offset: off, Data: rec.msg[:len(rec.msg):len(rec.msg)]})
						limit--
					}
					if off == p.hi {
						break
					}
				}
			}
			pos = end
		}
		if gap && gapFrom <= p.hi {
			lost = append(lost, Range{gapFrom, p.hi})
		}
		if limit == 0 {
			return buf, last, out, lost, nil
		}
		last = p.hi
	}
	return buf, last, out, lost, nil
}

// readAt reads n bytes of s at off into a new buffer (entries keep it).
func readAt(s *segment, off, n int64) ([]byte, error) {
	b := make([]byte, n)
	if _, err := s.f.ReadAt(b, off); err != nil {
		return nil, fmt.Errorf("seglog: read segment %d at %d: %w", s.id, off, err)
	}
	return b, nil
}

// inRanges reports whether x is in the sorted ranges rs.
func inRanges(rs []Range, x uint64) bool {
	lo, hi := 0, len(rs)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case rs[m].Last < x:
			lo = m + 1
		case rs[m].First > x:
			hi = m
		default:
			return true
		}
	}
	return false
}
