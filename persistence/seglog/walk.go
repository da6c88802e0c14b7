package seglog

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"os"
)

// walker reads the frames of one segment through a buffer: recovery, the
// compactor and the offline check walk a whole segment, ReadFrom the byte
// range of a run. After a bad frame it finds the next good one (resync).
type walker struct {
	sc      scanner
	version uint32
	hl      int
	limit   int64 // frames end before this position
	// crcBudget bounds the bytes a format 1 resync may checksum looking
	// for a frame (format 1 headers carry no checksum of their own).
	crcBudget int64
}

func newWalker(f *os.File, version uint32, limit int64) *walker {
	return &walker{sc: scanner{f: f, size: limit}, version: version, hl: frameHeaderLen(version), limit: limit, crcBudget: 1 << 30}
}

// frame is one frame the walker read.
type frame struct {
	pos, end int64
	body     []byte // valid until the walker's next read
	st       frameState
}

// at reads the frame at pos. A frame whose header is good but whose body
// does not match its checksum is frameBad with end set (its extent is
// known); a bad header leaves end at 0.
func (w *walker) at(pos int64) (frame, error) {
	fr := frame{pos: pos}
	h, err := w.sc.at(pos, w.hl)
	if err == io.EOF {
		fr.st = frameShort
		return fr, nil
	}
	if err != nil {
		return fr, err
	}
	n, crc, st := parseHeader(h, w.version, w.limit-pos)
	if st != frameOK {
		fr.st = st
		return fr, nil
	}
	body, err := w.sc.at(pos+int64(w.hl), n)
	if err == io.EOF {
		fr.st = frameShort
		return fr, nil
	}
	if err != nil {
		return fr, err
	}
	fr.end = pos + int64(w.hl) + int64(n)
	if !checkCRC(body, crc) {
		fr.st = frameBad
		return fr, nil
	}
	if _, err := decodeBody(body); err != nil {
		fr.st = frameBad
		return fr, nil
	}
	fr.body, fr.st = body, frameOK
	return fr, nil
}

// resync returns the position of the first good frame after the bad frame
// bad, or -1 if none follows before the limit. A frame whose extent is known
// is skipped whole first; otherwise every position is tried, format 2 by
// its header checksum, format 1 by a plausible header and the body's.
func (w *walker) resync(bad frame) (int64, error) {
	if bad.end > 0 {
		fr, err := w.at(bad.end)
		if err != nil || fr.st == frameOK {
			return bad.end, err
		}
	}
	for p := bad.pos + 1; p+int64(w.hl) <= w.limit; p++ {
		h, err := w.sc.at(p, w.hl)
		if err == io.EOF {
			return -1, nil
		}
		if err != nil {
			return -1, err
		}
		l := binary.LittleEndian.Uint32(h)
		if l == 0 || int64(l) > w.limit-p-int64(w.hl) {
			continue
		}
		if w.version >= 2 {
			if crc32.Checksum(h[:8], castagnoli) != binary.LittleEndian.Uint32(h[8:]) {
				continue
			}
		} else {
			if l > maxBodyV1 {
				continue
			}
			if w.crcBudget -= int64(l); w.crcBudget < 0 {
				return -1, nil // give up: the rest of the segment is skipped
			}
		}
		fr, err := w.at(p)
		if err != nil {
			return -1, err
		}
		if fr.st == frameOK {
			return p, nil
		}
	}
	return -1, nil
}

// nonZeroFrom reports whether any byte from pos to the limit is not zero.
func (w *walker) nonZeroFrom(pos int64) (int64, error) {
	for off := pos; off < w.limit; {
		n := int(min(int64(scanBuffer), w.limit-off))
		b, err := w.sc.at(off, n)
		if err != nil && err != io.EOF {
			return -1, err
		}
		if err == io.EOF {
			return -1, nil
		}
		if !bytes.Equal(b, zeros[:n]) {
			return off + int64(bytes.IndexFunc(b, func(r rune) bool { return r != 0 })), nil
		}
		off += int64(n)
	}
	return -1, nil
}
