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
		got, last, hintOut, err := readPlans(plans, hint, id, from, max-n, skip, buf)
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

func (l *Log) pinLocked(s *segment) { s.refs++ }

func (l *Log) unpinLocked(s *segment) {
	s.refs--
	if s.refs == 0 && s.removed {
		s.f.Close()
	}
}

// readPlans reads the planned runs in order and appends up to max records
// of group with offsets >= from (up to limit), strictly ascending, not in skip. It returns
// the highest offset it looked at (so the caller can go on after it) and a
// read hint for the next call.
func readPlans(plans []readPlan, hint readHint, group, from uint64, limit int, skip []Range, buf []Entry) ([]Entry, uint64, readHint, error) {
	var out readHint
	last := from - 1
	for _, p := range plans {
		pos := p.start
		if hint.seg == p.seg && p.runFirst <= hint.off && hint.off < from && pos < hint.pos && hint.pos <= p.end {
			pos = hint.pos // the records of offsets > hint.off follow it
		}
		var chunk []byte
		var chunkAt int64
		for pos < p.end && limit > 0 {
			if pos < chunkAt || pos+frameHeader > chunkAt+int64(len(chunk)) {
				var err error
				if chunk, err = readAt(p.seg, pos, min(readChunk, p.end-pos)); err != nil {
					return buf, last, out, err
				}
				chunkAt = pos
			}
			rel := int(pos - chunkAt)
			n, crc, st := parseHeader(chunk[rel:])
			if st != frameOK {
				return buf, last, out, fmt.Errorf("seglog: segment %d at %d: bad frame in the index", p.seg.id, pos)
			}
			if rel+frameHeader+n > len(chunk) {
				var err error
				if chunk, err = readAt(p.seg, pos, max(int64(frameHeader+n), min(readChunk, p.end-pos))); err != nil {
					return buf, last, out, err
				}
				chunkAt, rel = pos, 0
			}
			body := chunk[rel+frameHeader : rel+frameHeader+n]
			end := pos + frameHeader + int64(n)
			if typ := body[0]; typ == recMessage || typ == recMoved {
				if !checkCRC(body, crc) {
					return buf, last, out, fmt.Errorf("seglog: segment %d at %d: checksum mismatch", p.seg.id, pos)
				}
				rec, err := decodeBody(body)
				if err != nil {
					return buf, last, out, fmt.Errorf("seglog: segment %d at %d: %w", p.seg.id, pos, err)
				}
				if rec.group == group && rec.offset >= p.lo && rec.offset <= p.hi && rec.offset > last {
					last = rec.offset
					out = readHint{seg: p.seg, off: rec.offset, pos: end}
					if !inRanges(skip, rec.offset) {
						buf = append(buf, Entry{Offset: rec.offset, Data: rec.msg[:len(rec.msg):len(rec.msg)]})
						limit--
					}
					if rec.offset == p.hi {
						break
					}
				}
			}
			pos = end
		}
		if limit == 0 {
			return buf, last, out, nil
		}
		last = p.hi
	}
	return buf, last, out, nil
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
