package seglog

import (
	"bytes"
	"encoding/binary"
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
func (l *Log) recover() (spare *segment, err error) {
	start := time.Now()
	rep := &l.report
	ids, err := listSegments(l.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
	}
	var segs []*segment
	for _, id := range ids {
		s, err := openSegment(l.opts.Dir, id)
		if err != nil {
			for _, s := range segs {
				s.f.Close()
			}
			return nil, fmt.Errorf("%w: open segment %d: %w", ErrUnusable, id, err)
		}
		segs = append(segs, s)
	}
	l.mu.segs = segs // closed by Open on error
	// The last segment that holds data: a non-zero length at position 0.
	last := -1
	for i := len(segs) - 1; i >= 0 && last < 0; i-- {
		var h [4]byte
		if n, _ := segs[i].f.ReadAt(h[:], 0); n == 4 && binary.LittleEndian.Uint32(h[:]) != 0 {
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
			// Bytes in a segment without a first frame: the first commit into
			// it was torn (or its first header was damaged): keep a copy.
			if nz, err := firstNonZero(s, 0); err != nil {
				return nil, fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
			} else if nz >= 0 {
				l.copyToQuarantine(s, nz, "data in a segment without a first frame")
			}
			if junk, err := l.zeroFrom(s, 0); err != nil {
				return nil, fmt.Errorf("%w: clear segment %d: %w", ErrUnusable, s.id, err)
			} else if junk > 0 {
				rep.TornBytes += junk
				l.log.Warn("cleared a segment without a first frame", "segment", s.id, "bytes", junk)
			}
			if last >= 0 {
				spare = s
			} else {
				keep = append(keep, s)
			}
			continue
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
	if len(keep) == 0 {
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
	l.w.seg = l.active()
	l.w.end = l.w.seg.end
	rep.Took = time.Since(start)
	l.log.Debug("recovered", "segments", rep.Segments, "bytes", rep.Bytes, "records", rep.Records, "live", rep.Live,
		"torn_bytes", rep.TornBytes, "corrupt", rep.Corrupt, "garbage", rep.Garbage, "lost", rep.Lost, "took", rep.Took)
	return spare, nil
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
	for _, r := range lost {
		for off := r.First; off <= r.Last; off++ {
			l.resolveLocked(g, off, false)
		}
		l.report.Lost += r.Last - r.First + 1
	}
	if len(lost) > 0 {
		l.log.Error("messages lost: no record found for unresolved offsets", "group", g.id, "ranges", lost)
	}
	g.advanceLocked()
	g.assigned = g.head
	g.cache.from = g.head + 1
}

// scan reads one segment: it applies its records, sets its end, and repairs
// a torn tail (in the last segment) or quarantines a bad frame (elsewhere).
func (l *Log) scan(s *segment, last bool) error {
	rep := &l.report
	sc := scanner{f: s.f, size: s.size}
	pos := int64(0)
	bad := ""
	for {
		h, err := sc.at(pos, frameHeader)
		if err == io.EOF {
			bad = "" // the file ends on a frame boundary without a terminating zero
			if pos+frameHeader <= s.size {
				bad = "short header"
			}
			break
		}
		if err != nil {
			return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
		}
		n, crc, st := parseHeader(h)
		if st == frameEnd {
			break
		}
		if st == frameBad {
			bad = "impossible length"
			break
		}
		body, err := sc.at(pos+frameHeader, n)
		if err == io.EOF {
			bad = "frame runs past the end of the segment"
			break
		}
		if err != nil {
			return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
		}
		if !checkCRC(body, crc) {
			bad = "checksum mismatch"
			break
		}
		rec, err := decodeBody(body)
		if err != nil {
			bad = "undecodable record"
			break
		}
		end := pos + frameHeader + int64(n)
		if err := l.applyLocked(s, &rec, pos, end); err != nil {
			bad = err.Error()
			break
		}
		pos = end
	}
	s.end = pos
	rep.Bytes += min(s.size, max(pos, sc.read))
	if last {
		junk, err := l.zeroFrom(s, pos)
		if err != nil {
			return fmt.Errorf("%w: truncate the torn tail of segment %d: %w", ErrUnusable, s.id, err)
		}
		if junk > 0 {
			rep.TornBytes += junk
			l.log.Warn("truncated the torn tail of the last commit", "segment", s.id, "pos", pos, "bytes", junk, "reason", bad)
		}
		return nil
	}
	if bad == "" {
		// A sealed segment ends with zeros; anything else after its end is damage.
		nz, err := firstNonZero(s, pos)
		if err != nil {
			return fmt.Errorf("%w: read segment %d: %w", ErrUnusable, s.id, err)
		}
		if nz < 0 {
			return nil
		}
		bad = "data after the end marker"
		pos = nz
	}
	l.quarantine(s, pos, bad)
	return nil
}

// applyLocked applies one valid record found at pos..end of s.
func (l *Log) applyLocked(s *segment, rec *record, pos, end int64) error {
	rep := &l.report
	s.records++
	rep.Records++
	g := l.mu.groups[rec.group]
	if g == nil {
		if rec.typ != recResolve {
			rep.Garbage++
			l.mu.retired[rec.group] = struct{}{}
		}
		return nil
	}
	switch rec.typ {
	case recMessage, recMoved:
		g.head = max(g.head, rec.offset)
		if rec.offset <= g.cursor || g.resolved.contains(rec.offset) || g.findRun(rec.offset) >= 0 {
			return nil // resolved, or a copy of an offset indexed already
		}
		g.indexLocked(rec.offset, s, pos, end, uint64(len(rec.msg)))
		rep.Live++
	case recResolve:
		d := rec.rangeDecoder()
		for r, ok := d.next(); ok; r, ok = d.next() {
			l.resolveRangeLocked(g, r)
		}
		if d.err != nil {
			return fmt.Errorf("bad resolve record: %w", d.err)
		}
		g.advanceLocked()
	}
	return nil
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

// quarantine reports a bad frame of s at pos and keeps a copy of its bytes;
// the rest of s is skipped.
func (l *Log) quarantine(s *segment, pos int64, reason string) {
	l.report.Corrupt++
	if name, ok := l.copyToQuarantine(s, pos, reason); ok {
		l.log.Error("corrupt segment: the rest of it is skipped", "segment", s.id, "pos", pos, "reason", reason, "quarantined", name)
	}
}

// copyToQuarantine copies up to quarantineMax bytes of s from pos to
// Dir/quarantine/<segment>-<pos>.bin.
func (l *Log) copyToQuarantine(s *segment, pos int64, reason string) (string, bool) {
	rep := &l.report
	n := min(quarantineMax, s.size-pos)
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
	rep.Quarantined = append(rep.Quarantined, name)
	return name, true
}

// zeroFrom writes zeros over the non-zero bytes of s from pos on and makes
// that durable; it returns how many bytes past pos held data (up to the last
// non-zero byte).
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
			if err := zeroRange(s.f, off, off+int64(len(b))); err != nil {
				return 0, err
			}
		}
	}
	if lastNZ < 0 {
		return 0, nil
	}
	if !l.opts.NoSync {
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
	if _, err := sc.f.ReadAt(sc.buf, pos); err != nil && err != io.EOF {
		return nil, err
	}
	sc.at0 = pos
	sc.read = max(sc.read, pos+int64(want))
	return sc.buf[:n], nil
}
