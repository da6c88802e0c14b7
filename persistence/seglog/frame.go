package seglog

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Frame layout: uint32 LE body length | uint32 LE CRC-32C of body | body.
// A zero length marks the end of a segment's data (segments are pre-zeroed).
const frameHeader = 8

// Record types: the first byte of a body.
const (
	recMessage byte = 1 // type | uvarint group | uvarint offset | message
	recMoved   byte = 2 // same as recMessage: a copy written by compaction
	recResolve byte = 3 // type | uvarint group | uvarint count | count × (uvarint gap, uvarint run length)
)

// Size bounds.
const (
	// maxMsgHeader bounds type + uvarint group + uvarint offset.
	maxMsgHeader = 1 + 2*binary.MaxVarintLen64
	// maxBody is the largest body a frame may hold.
	maxBody = MaxMessageSize + maxMsgHeader
	// maxResolveRanges bounds the ranges of one resolve record, so that a
	// resolve record stays small; a larger set is written as several records.
	maxResolveRanges = 4096
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errFrame is wrapped by every decoding error.
var errFrame = errors.New("bad frame")

// msgFrameBound returns an upper bound of the frame size of a message of n bytes.
func msgFrameBound(n int) int { return frameHeader + maxMsgHeader + n }

// appendMsgFrame appends a message (or moved) frame to dst and returns it and
// the position of the message bytes within it.
func appendMsgFrame(dst []byte, typ byte, group, offset uint64, msg []byte) ([]byte, int) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, typ)
	dst = binary.AppendUvarint(dst, group)
	dst = binary.AppendUvarint(dst, offset)
	at := len(dst)
	dst = append(dst, msg...)
	sealFrame(dst[start:])
	return dst, at
}

// sealFrame fills in the header of the frame f (header and body).
func sealFrame(f []byte) {
	body := f[frameHeader:]
	binary.LittleEndian.PutUint32(f[0:], uint32(len(body)))
	binary.LittleEndian.PutUint32(f[4:], crc32.Checksum(body, castagnoli))
}

// appendResolveFrame appends a resolve frame for ranges (sorted, disjoint,
// at most maxResolveRanges) to dst.
func appendResolveFrame(dst []byte, group uint64, ranges []Range) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, recResolve)
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

// frameState says what readFrame found at a position.
type frameState int

const (
	frameOK    frameState = iota
	frameEnd              // a zero length: the end of the data
	frameShort            // the header or body runs past the available bytes
	frameBad              // impossible length or CRC mismatch
)

// parseHeader reads a frame header. It returns the body length.
func parseHeader(h []byte) (n int, crc uint32, st frameState) {
	if len(h) < frameHeader {
		return 0, 0, frameShort
	}
	l := binary.LittleEndian.Uint32(h)
	if l == 0 {
		return 0, 0, frameEnd
	}
	if l > maxBody {
		return 0, 0, frameBad
	}
	return int(l), binary.LittleEndian.Uint32(h[4:]), frameOK
}

// record is a decoded message or resolve body. For a resolve record ranges
// holds the encoded ranges (decode them with nextRange).
type record struct {
	typ    byte
	group  uint64
	offset uint64 // message and moved
	msg    []byte // message and moved: aliases the body
	count  uint64 // resolve: number of ranges
	ranges []byte // resolve: the encoded ranges
}

// decodeBody decodes a frame body whose CRC matched.
func decodeBody(b []byte) (record, error) {
	var r record
	if len(b) == 0 {
		return r, errFrame
	}
	r.typ = b[0]
	b = b[1:]
	g, n := binary.Uvarint(b)
	if n <= 0 {
		return r, errFrame
	}
	r.group, b = g, b[n:]
	switch r.typ {
	case recMessage, recMoved:
		off, n := binary.Uvarint(b)
		if n <= 0 || off == 0 {
			return r, errFrame
		}
		r.offset, r.msg = off, b[n:]
	case recResolve:
		c, n := binary.Uvarint(b)
		if n <= 0 || c > maxResolveRanges {
			return r, errFrame
		}
		r.count, r.ranges = c, b[n:]
	default:
		return r, errFrame
	}
	return r, nil
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
