package seglog

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Frame layouts (see the package doc, Files and framing):
//
//	format 1: uint32 LE body length | uint32 LE CRC-32C of body | body
//	format 2: uint32 LE body length | uint32 LE CRC-32C of body |
//	          uint32 LE CRC-32C of the 8 bytes before it | body
//
// A zero header marks the end of a segment's data (segments are pre-zeroed).
// The header checksum of format 2 lets a reader that met a damaged frame find
// the next good one by its header alone, and tells a damaged length from the
// end of the data.
const (
	frameHeaderV1 = 8
	frameHeaderV2 = 12
	// frameHeader is the header size of the frames this package writes.
	frameHeader = frameHeaderV2
)

// frameHeaderLen returns the frame header size of a segment format.
func frameHeaderLen(version uint32) int {
	if version < 2 {
		return frameHeaderV1
	}
	return frameHeaderV2
}

// Record types: the first byte of a body.
const (
	recMessage byte = 1 // format 1: type | uvarint group | uvarint offset | message
	recMoved   byte = 2 // format 1: same as recMessage: a copy written by compaction
	recResolve byte = 3 // type | uvarint group | uvarint count | count × (uvarint gap, uvarint run length)
	// recShared is a message stored once for the groups of one append:
	// type | uvarint n | n × (uvarint group, uvarint offset) | message.
	recShared byte = 4
	// recSharedMoved is the same, written by compaction for the groups
	// whose copy in an older segment was still live.
	recSharedMoved byte = 5
)

// isMessage reports whether typ is a record type that holds a message.
func isMessage(typ byte) bool {
	return typ == recMessage || typ == recMoved || typ == recShared || typ == recSharedMoved
}

// isMoved reports whether typ is a copy written by compaction.
func isMoved(typ byte) bool { return typ == recMoved || typ == recSharedMoved }

// Size bounds.
const (
	// maxRefBytes bounds one group reference: uvarint group, uvarint offset.
	maxRefBytes = 2 * binary.MaxVarintLen64
	// maxMsgHeader bounds type + uvarint count + one reference.
	maxMsgHeader = 1 + binary.MaxVarintLen64 + maxRefBytes
	// maxBodyV1 is the largest body a format 1 frame may hold.
	maxBodyV1 = MaxMessageSize + 1 + maxRefBytes
	// maxResolveRanges bounds the ranges of one resolve record, so that a
	// resolve record stays small; a larger set is written as several records.
	maxResolveRanges = 4096
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errFrame is wrapped by every decoding error.
var errFrame = errors.New("bad frame")

// msgFrameBound returns an upper bound of the frame size of a message of n
// bytes stored for groups groups.
func msgFrameBound(n, groups int) int {
	return frameHeader + 1 + binary.MaxVarintLen64 + groups*maxRefBytes + n
}

// ref is one group's reference to a stored message: its offset in the group.
type ref struct{ group, offset uint64 }

// appendMsgFrame appends a recShared (or recSharedMoved) frame holding msg
// for refs to dst.
func appendMsgFrame(dst []byte, typ byte, refs []ref, msg []byte) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, frameHeader)...)
	dst = append(dst, typ)
	dst = binary.AppendUvarint(dst, uint64(len(refs)))
	for _, r := range refs {
		dst = binary.AppendUvarint(dst, r.group)
		dst = binary.AppendUvarint(dst, r.offset)
	}
	dst = append(dst, msg...)
	sealFrame(dst[start:])
	return dst
}

// sealFrame fills in the (format 2) header of the frame f (header and body).
func sealFrame(f []byte) {
	body := f[frameHeader:]
	binary.LittleEndian.PutUint32(f[0:], uint32(len(body)))
	binary.LittleEndian.PutUint32(f[4:], crc32.Checksum(body, castagnoli))
	binary.LittleEndian.PutUint32(f[8:], crc32.Checksum(f[:8], castagnoli))
}

// appendResolveFrame appends a resolve frame for ranges (sorted, disjoint,
// at most maxResolveRanges) to dst.
func appendResolveFrame(dst []byte, group uint64, ranges []Range) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, frameHeader)...)
	dst = append(dst, recResolve)
	dst = binary.AppendUvarint(dst, group)
	dst = binary.AppendUvarint(dst, uint64(len(ranges)))
	var prev uint64 // end of the previous range (0 before the first)
	for _, r := range ranges {
		dst = binary.AppendUvarint(dst, r.First-prev)
		dst = binary.AppendUvarint(dst, r.Last-r.First+1)
		prev = r.Last
	}
	sealFrame(dst[start:])
	return dst
}

// resolveFrameBound bounds the frame size of a resolve record of n ranges.
func resolveFrameBound(n int) int {
	return frameHeader + 1 + 2*binary.MaxVarintLen64 + n*2*binary.MaxVarintLen64
}

// frameState says what parseHeader found at a position.
type frameState int

const (
	frameOK    frameState = iota
	frameEnd              // a zero header: the end of the data
	frameShort            // the header or body runs past the available bytes
	frameBad              // impossible length, header or body checksum mismatch, undecodable body
)

func (st frameState) String() string {
	switch st {
	case frameOK:
		return "good frame"
	case frameEnd:
		return "data after the end marker"
	case frameShort:
		return "the file ends inside a frame (truncated?)"
	}
	return "bad frame (length, checksum or body)"
}

// parseHeader reads a frame header of a segment of the given format; room
// is the number of bytes of the segment from the header on. It returns the
// body length and CRC.
func parseHeader(h []byte, version uint32, room int64) (n int, crc uint32, st frameState) {
	hl := frameHeaderLen(version)
	if len(h) < hl || room < int64(hl) {
		return 0, 0, frameShort
	}
	l := binary.LittleEndian.Uint32(h)
	crc = binary.LittleEndian.Uint32(h[4:])
	if version < 2 {
		switch {
		case l == 0 && crc == 0:
			return 0, 0, frameEnd
		case l == 0 || l > maxBodyV1:
			return 0, 0, frameBad
		case int64(l) > room-int64(hl):
			return 0, 0, frameShort
		}
		return int(l), crc, frameOK
	}
	hcrc := binary.LittleEndian.Uint32(h[8:])
	switch {
	case l == 0 && crc == 0 && hcrc == 0:
		return 0, 0, frameEnd
	case crc32.Checksum(h[:8], castagnoli) != hcrc || l == 0:
		return 0, 0, frameBad
	case int64(l) > room-int64(hl):
		return 0, 0, frameShort // a good header whose body the file does not hold: truncated
	}
	return int(l), crc, frameOK
}

// record is a decoded body. A message record's references are walked with
// refs(); a resolve record's ranges with rangeDecoder().
type record struct {
	typ byte
	// Message records: n references, encoded in refsRaw (recShared,
	// recSharedMoved) or held in group and offset (recMessage, recMoved).
	n       int
	refsRaw []byte
	group   uint64 // also the group of a resolve record
	offset  uint64
	msg     []byte // aliases the body
	// Resolve records.
	count  uint64
	ranges []byte
}

// decodeBody decodes a frame body whose CRC matched, checking every field.
func decodeBody(b []byte) (record, error) {
	var r record
	if len(b) == 0 {
		return r, errFrame
	}
	r.typ = b[0]
	b = b[1:]
	switch r.typ {
	case recMessage, recMoved:
		x, n := parseRef(b)
		if n <= 0 {
			return r, errFrame
		}
		r.n, r.group, r.offset, r.msg = 1, x.group, x.offset, b[n:]
	case recShared, recSharedMoved:
		c, n := binary.Uvarint(b)
		if n <= 0 || c == 0 || c > uint64(len(b)) {
			return r, errFrame
		}
		raw := b[n:]
		p := raw
		for range c {
			_, n := parseRef(p)
			if n <= 0 {
				return r, errFrame
			}
			p = p[n:]
		}
		r.n, r.refsRaw, r.msg = int(c), raw[:len(raw)-len(p)], p
	case recResolve:
		g, n := binary.Uvarint(b)
		if n <= 0 {
			return r, errFrame
		}
		c, m := binary.Uvarint(b[n:])
		if m <= 0 || c > maxResolveRanges {
			return r, errFrame
		}
		r.group, r.count, r.ranges = g, c, b[n+m:]
		d := r.rangeDecoder()
		for _, ok := d.next(); ok; _, ok = d.next() {
		}
		if d.err != nil || d.left != 0 {
			return r, errFrame
		}
	default:
		return r, errFrame
	}
	return r, nil
}

// parseRef reads one reference (uvarint group, uvarint offset > 0) and
// returns it and the bytes it took, 0 if b does not start with one.
func parseRef(b []byte) (ref, int) {
	g, n := binary.Uvarint(b)
	if n <= 0 {
		return ref{}, 0
	}
	off, m := binary.Uvarint(b[n:])
	if m <= 0 || off == 0 {
		return ref{}, 0
	}
	return ref{g, off}, n + m
}

// refIter walks the references of a message record.
type refIter struct {
	r    *record
	i    int
	rest []byte
}

func (r *record) refs() refIter { return refIter{r: r, rest: r.refsRaw} }

// next returns the next reference; ok is false after the last. The record
// was checked by decodeBody, so decoding cannot fail.
func (it *refIter) next() (ref, bool) {
	if it.i >= it.r.n {
		return ref{}, false
	}
	it.i++
	if it.r.refsRaw == nil {
		return ref{it.r.group, it.r.offset}, true
	}
	x, n := parseRef(it.rest)
	it.rest = it.rest[n:]
	return x, true
}

// offsetOf returns the offset the record holds for group, if any.
func (r *record) offsetOf(group uint64) (uint64, bool) {
	it := r.refs()
	for x, ok := it.next(); ok; x, ok = it.next() {
		if x.group == group {
			return x.offset, true
		}
	}
	return 0, false
}

// rangeDecoder walks the ranges of a resolve record.
type rangeDecoder struct {
	b    []byte
	left uint64
	prev uint64
	err  error
}

func (r *record) rangeDecoder() rangeDecoder { return rangeDecoder{b: r.ranges, left: r.count} }

// next returns the next range; ok is false at the end or on an error (d.err).
func (d *rangeDecoder) next() (Range, bool) {
	if d.left == 0 || d.err != nil {
		return Range{}, false
	}
	gap, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errFrame
		return Range{}, false
	}
	d.b = d.b[n:]
	l, n := binary.Uvarint(d.b)
	if n <= 0 || l == 0 {
		d.err = errFrame
		return Range{}, false
	}
	d.b = d.b[n:]
	first := d.prev + gap
	last := first + l - 1
	if first < d.prev || (d.prev != 0 && first <= d.prev) || first == 0 || last < first {
		d.err = errFrame
		return Range{}, false
	}
	d.prev = last
	d.left--
	return Range{first, last}, true
}

// checkCRC reports whether body matches crc.
func checkCRC(body []byte, crc uint32) bool { return crc32.Checksum(body, castagnoli) == crc }
