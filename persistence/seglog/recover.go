package seglog

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

const (
	// scanBuffer is the read-ahead of the recovery scan.
	scanBuffer = 1 << 20
	// quarantineMax bounds the bytes copied to quarantine per bad frame.
	quarantineMax = 4 << 20
	quarantineDir = "quarantine"
)

// recover scans every segment in order and rebuilds the index (see the
// package doc, Recovery). It returns the spare segment, if one was found.
// With Options.ReadOnly it changes nothing and reports what it would do.
func (l *Log) recover() (spare *segment, err error) {
	start := time.Now()
	rep := &l.report
	ro := l.opts.ReadOnly
	ids, err := segmentIDs(l.opts.Dir, !ro)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
	}
	var segs []*segment
	mode := os.O_RDWR
	if ro {
		mode = os.O_RDONLY
	}
	for _, id := range ids {
		s, err := openSegmentMode(l.opts.Dir, id, mode)
		if err != nil {
			for _, s := range segs {
				s.f.Close()
			}
			return nil, fmt.Errorf("%w: open segment %d: %w", ErrUnusable, id, err)
		}
		segs = append(segs, s)
	}
	l.mu.segs = segs // closed by Open on error
	// Refuse a newer format before anything is changed.
	for _, s := range segs {
		if s.version > FormatVersion {
			return nil, newerError(s.path, s.version)
		}
	}
	// The last segment that holds data at its first frame position.
	last := -1
	for i := len(segs) - 1; i >= 0 && last < 0; i-- {
		if segs[i].holdsData() {
			last = i
		}
	}
	// Segments after it never held a committed frame: keep one as the spare.
	var keep []*segment
	for i, s := range segs {
		if i <= last {
			keep = append(keep, s)
			continue
		}
		if s.size == l.opts.SegmentSize && (last >= 0 && spare == nil || last < 0 && len(keep) < 2) {
			if err := l.clearUnused(s); err != nil {
				return nil, err
			}
			if last >= 0 {
				spare = s
			} else {
				keep = append(keep, s)
			}
			continue
		}
		if ro {
			continue // would be removed
		}
		s.f.Close()
		if err := os.Remove(s.path); err != nil {
			return nil, fmt.Errorf("%w: remove unused segment %d: %w", ErrUnusable, s.id, err)
		}
	}
	if last < 0 && len(keep) == 2 {
		spare, keep = keep[1], keep[:1]
	}
	l.mu.segs = keep
	if len(keep) == 0 && !ro {
		id := uint64(1)
		if len(ids) > 0 {
			id = ids[len(ids)-1] + 1
		}
		s, err := createSegment(l.opts.Dir, id, l.opts.SegmentSize, l.opts.NoSync)
		if err != nil {
			return nil, fmt.Errorf("%w: create segment: %w", ErrUnusable, err)
		}
		l.mu.segs = []*segment{s}
	}
	for i, s := range l.mu.segs {
		isLast := i == len(l.mu.segs)-1
		switch {
		case s.hdrState == headerDamaged:
			l.damage(s, 0, segHeaderSize, "damaged segment header")
		case s.hdrState == headerOK && s.hdr.size > s.size:
			l.damage(s, s.size, 0, fmt.Sprintf("truncated: the file has %d bytes, its header says %d", s.size, s.hdr.size))
		}
		if err := l.scan(s, isLast); err != nil {
			if spare != nil {
				spare.f.Close()
			}
			return nil, err
		}
		s.sealed = !isLast
		rep.Segments++
	}
	for _, g := range l.mu.groups {
		l.settleLocked(g)
	}
	if len(l.mu.segs) > 0 {
		l.w.seg = l.active()
		l.w.end = l.w.seg.end
	}
	rep.Took = time.Since(start)
	l.log.Debug("recovered", "segments", rep.Segments, "bytes", rep.Bytes, "records", rep.Records, "live", rep.Live,
		"torn_bytes", rep.TornBytes, "corrupt", rep.Corrupt, "garbage", rep.Garbage, "lost", rep.Lost, "took", rep.Took)
	return spare, nil
}

// clearUnused prepares a segment that never held a committed frame for
// use: bytes in it (the first commit into it was torn, or its first header
// was damaged) are copied to quarantine and zeroed, and a segment without a
// header (a format 1 spare) gets one.
func (l *Log) clearUnused(s *segment) error {
	if nz, err := firstNonZero(s, s.base); err != nil {
		return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
	} else if nz >= 0 {
		l.copyToQuarantine(s, nz, s.size-nz, "data in a segment without a first frame")
	}
	if junk, err := l.zeroFrom(s, s.base); err != nil {
		return fmt.Errorf("%w: clear segment %d: %w", ErrUnusable, s.id, err)
	} else if junk > 0 {
		l.report.TornBytes += junk
		l.log.Warn("cleared a segment without a first frame", "segment", s.id, "bytes", junk)
	}
	if (s.version < FormatVersion || s.hdrState != headerOK) && !l.opts.ReadOnly {
		if err := s.writeHeader(l.opts.NoSync); err != nil {
			return fmt.Errorf("%w: write the header of segment %d: %w", ErrUnusable, s.id, err)
		}
	}
	s.end = s.base
	return nil
}

// settleLocked finishes a group's recovery: resolutions beyond the head go,
// the cursor advances, and unresolved offsets no record was found for (lost
// to corruption) are resolved, so that the cursor can pass them.
func (l *Log) settleLocked(g *group) {
	for n := g.resolved.len(); n > 0 && g.resolved.r[n-1].Last > g.head; n = g.resolved.len() {
		if r := &g.resolved.r[n-1]; r.First <= g.head {
			r.Last = g.head
		} else {
			g.resolved.r = g.resolved.r[:n-1]
		}
	}
	g.advanceLocked()
	var lost []Range
	next := g.cursor + 1
	gap := func(to uint64) { // next..to holds neither a run nor a resolved offset
		for next <= to {
			j := g.resolved.find(next)
			if j < g.resolved.len() && g.resolved.r[j].First <= next {
				next = g.resolved.r[j].Last + 1
				continue
			}
			end := to
			if j < g.resolved.len() && g.resolved.r[j].First <= to {
				end = g.resolved.r[j].First - 1
			}
			lost = append(lost, Range{next, end})
			next = end + 1
		}
	}
	for _, r := range g.runs {
		if r.first > next {
			gap(r.first - 1)
		}
		next = max(next, r.last+1)
	}
	gap(g.head)
	l.loseLocked(g, lost)
	if len(lost) > 0 {
		l.log.Error("messages lost: no record found for unresolved offsets", "group", g.id, "ranges", lost)
	}
	g.advanceLocked()
	g.assigned = g.head
	g.cache.from = g.head + 1
}

// loseLocked resolves the unresolved offsets of ranges whose records are
// gone, and counts them as lost.
func (l *Log) loseLocked(g *group, ranges []Range) {
	for _, r := range ranges {
		for off := r.First; off <= r.Last; off++ {
			if l.resolveLocked(g, off, false) {
				g.lost++
				l.report.Lost++
			}
		}
	}
}

// scan reads one segment: it applies its good records and sets its end.
// After a bad frame it goes on at the next good frame (the bad bytes are
// copied to quarantine); only a bad frame that no good frame follows in the
// last segment is a torn tail (the last commit did not complete), cut off;
// one in a sealed segment is damage too, and the rest of that segment is
// skipped.
func (l *Log) scan(s *segment, last bool) error {
	rep := &l.report
	w := newWalker(s.f, s.version, s.size)
	pos := s.base
	for {
		fr, err := w.at(pos)
		if err != nil {
			return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
		}
		if fr.st == frameOK {
			rec, _ := decodeBody(fr.body) // checked by at
			l.applyLocked(s, &rec, pos, fr.end)
			pos = fr.end
			continue
		}
		reason := fr.st.String()
		if fr.st == frameEnd {
			nz, err := w.nonZeroFrom(pos)
			if err != nil {
				return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
			}
			if nz < 0 {
				break // the end of the data: zeros to the end
			}
		}
		next, err := w.resync(fr)
		if err != nil {
			return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
		}
		if next >= 0 {
			// Good frames follow: damage, not the end of the data.
			l.damage(s, pos, next-pos, reason)
			pos = next
			continue
		}
		if !last {
			nz, err := w.nonZeroFrom(pos)
			if err != nil {
				return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
			}
			if nz >= 0 {
				l.damage(s, pos, s.size-pos, reason+"; nothing readable after it")
			}
		}
		break
	}
	s.end = pos
	rep.Bytes += min(s.size, max(pos, w.sc.read))
	if !last {
		return nil
	}
	junk, err := l.zeroFrom(s, pos)
	if err != nil {
		return fmt.Errorf("%w: truncate the torn tail of segment %d: %w", ErrUnusable, s.id, err)
	}
	if junk > 0 {
		rep.TornBytes += junk
		l.log.Warn("truncated the torn tail of the last commit", "segment", s.id, "pos", pos, "bytes", junk)
	}
	return nil
}

// damage reports n damaged bytes of s at pos and keeps a copy of them.
func (l *Log) damage(s *segment, pos, n int64, reason string) {
	l.report.Corrupt++
	l.report.Damage = append(l.report.Damage, Damage{Segment: s.id, Path: s.path, Pos: pos, Len: n, Reason: reason})
	name, _ := l.copyToQuarantine(s, pos, n, reason)
	l.log.Error("damaged segment: bytes skipped", "segment", s.id, "pos", pos, "bytes", n, "reason", reason, "quarantined", name)
}

// applyLocked applies one valid record found at pos..end of s.
func (l *Log) applyLocked(s *segment, rec *record, pos, end int64) {
	rep := &l.report
	s.records++
	rep.Records++
	if rec.typ == recResolve {
		g := l.mu.groups[rec.group]
		if g == nil {
			return
		}
		d := rec.rangeDecoder() // checked by decodeBody
		for r, ok := d.next(); ok; r, ok = d.next() {
			l.resolveRangeLocked(g, r)
		}
		g.advanceLocked()
		return
	}
	it := rec.refs()
	for x, ok := it.next(); ok; x, ok = it.next() {
		s.msgRefs++
		g := l.mu.groups[x.group]
		if g == nil {
			rep.Garbage++
			l.mu.retired[x.group] = struct{}{}
			continue
		}
		g.head = max(g.head, x.offset)
		if x.offset <= g.cursor || g.resolved.contains(x.offset) || g.findRun(x.offset) >= 0 {
			continue // resolved, or a copy of an offset indexed already
		}
		g.indexLocked(x.offset, s, pos, end, uint64(len(rec.msg)))
		rep.Live++
	}
}

// resolveRangeLocked applies a durable resolution of r during recovery.
func (l *Log) resolveRangeLocked(g *group, r Range) {
	first := max(r.First, g.cursor+1)
	for off := first; off <= r.Last; off++ {
		if i := g.findRun(off); i < 0 {
			// Nothing indexed here: add up to the next run at once.
			j := len(g.runs)
			for k := range g.runs {
				if g.runs[k].first > off {
					j = k
					break
				}
			}
			to := r.Last
			if j < len(g.runs) && g.runs[j].first <= r.Last {
				to = g.runs[j].first - 1
			}
			g.resolved.addRange(off, to)
			off = to
			continue
		}
		if g.resolved.add(off) {
			if i := g.findRun(off); i >= 0 {
				g.unindexLocked(i, 0, false)
				l.report.Live--
			}
		}
	}
}

// copyToQuarantine copies up to quarantineMax of the n bytes of s at pos to
// Dir/quarantine/<segment>-<pos>.bin (nothing with ReadOnly).
func (l *Log) copyToQuarantine(s *segment, pos, n int64, reason string) (string, bool) {
	if l.opts.ReadOnly {
		return "", false
	}
	n = min(n, quarantineMax, s.size-pos)
	name := filepath.Join(l.opts.Dir, quarantineDir, fmt.Sprintf("%020d-%d.bin", s.id, pos))
	b := make([]byte, n)
	_, err := s.f.ReadAt(b, pos)
	if err == nil || err == io.EOF {
		if err = os.MkdirAll(filepath.Dir(name), 0o700); err == nil {
			err = os.WriteFile(name, b, 0o600)
		}
	}
	if err != nil {
		l.log.Error("could not quarantine", "segment", s.id, "pos", pos, "reason", reason, "error", err)
		return "", false
	}
	l.report.Quarantined = append(l.report.Quarantined, name)
	return name, true
}

// zeroFrom writes zeros over the non-zero bytes of s from pos on and makes
// that durable; it returns how many bytes past pos held data (up to the last
// non-zero byte). With ReadOnly it only counts them.
func (l *Log) zeroFrom(s *segment, pos int64) (int64, error) {
	buf := make([]byte, scanBuffer)
	lastNZ := int64(-1)
	for off := pos; off < s.size; off += int64(len(buf)) {
		b := buf[:min(int64(len(buf)), s.size-off)]
		if _, err := s.f.ReadAt(b, off); err != nil && err != io.EOF {
			return 0, err
		}
		if i := lastNonZero(b); i >= 0 {
			lastNZ = off + int64(i)
			if l.opts.ReadOnly {
				continue
			}
			if err := zeroRange(s.f, off, off+int64(len(b))); err != nil {
				return 0, err
			}
		}
	}
	if lastNZ < 0 {
		return 0, nil
	}
	if !l.opts.NoSync && !l.opts.ReadOnly {
		if err := fdatasync(s.f); err != nil {
			return 0, err
		}
	}
	return lastNZ + 1 - pos, nil
}

func lastNonZero(b []byte) int {
	if bytes.Equal(b, zeros[:len(b)]) {
		return -1
	}
	for i := len(b) - 1; ; i-- {
		if b[i] != 0 {
			return i
		}
	}
}

// firstNonZero returns the position of the first non-zero byte of s at or
// after pos, or -1.
func firstNonZero(s *segment, pos int64) (int64, error) {
	buf := make([]byte, scanBuffer)
	for off := pos; off < s.size; off += int64(len(buf)) {
		b := buf[:min(int64(len(buf)), s.size-off)]
		if _, err := s.f.ReadAt(b, off); err != nil && err != io.EOF {
			return 0, err
		}
		if !bytes.Equal(b, zeros[:len(b)]) {
			return off + int64(bytes.IndexFunc(b, func(r rune) bool { return r != 0 })), nil
		}
	}
	return -1, nil
}

// scanner reads a segment sequentially through a buffer.
type scanner struct {
	f    *os.File
	size int64
	buf  []byte
	at0  int64 // file position of buf[0]
	read int64 // bytes read so far (the furthest position)
}

// at returns n bytes at pos (valid until the next call), or io.EOF if they
// run past the end of the file.
func (sc *scanner) at(pos int64, n int) ([]byte, error) {
	if pos+int64(n) > sc.size {
		return nil, io.EOF
	}
	if pos >= sc.at0 && pos+int64(n) <= sc.at0+int64(len(sc.buf)) {
		return sc.buf[pos-sc.at0 : pos-sc.at0+int64(n)], nil
	}
	want := max(n, scanBuffer)
	want = int(min(int64(want), sc.size-pos))
	if cap(sc.buf) < want {
		sc.buf = make([]byte, want)
	}
	sc.buf = sc.buf[:want]
	m, err := sc.f.ReadAt(sc.buf, pos)
	if err != nil && err != io.EOF {
		return nil, err
	}
	if m < n {
		return nil, io.EOF // the file is shorter than it was
	}
	sc.buf = sc.buf[:m]
	sc.at0 = pos
	sc.read = max(sc.read, pos+int64(m))
	return sc.buf[:n], nil
}
