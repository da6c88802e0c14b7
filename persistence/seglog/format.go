package seglog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
)

// FormatVersion is the segment format this package writes. Format 1
// segments (no header, single-group message records, 8-byte frame headers)
// are read, never written: a log opened over them writes new segments in
// this format and drops the old ones as their records resolve.
const FormatVersion = 2

// ErrNewerFormat is returned by Open for a segment written in a format
// newer than FormatVersion, by a newer keyline; nothing is changed.
var ErrNewerFormat = errors.New("seglog: data written by a newer keyline")

// A format 2 segment starts with a header:
//
//	magic "KLSG" | uint32 LE format | uint64 LE segment id |
//	uint64 LE size it was created with | uint32 LE CRC-32C of the 28 bytes before | 4 zero bytes
//
// and its frames follow from segHeaderSize on.
const (
	segMagic      = "KLSG"
	segHeaderSize = 32
)

// segHeader is what a segment's header says.
type segHeader struct {
	version uint32
	id      uint64
	size    int64
}

func appendSegHeader(dst []byte, h segHeader) []byte {
	start := len(dst)
	dst = append(dst, segMagic...)
	dst = binary.LittleEndian.AppendUint32(dst, h.version)
	dst = binary.LittleEndian.AppendUint64(dst, h.id)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.size))
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
	return append(dst, 0, 0, 0, 0)
}

// headerState says what the first bytes of a segment file are.
type headerState int

const (
	headerNone    headerState = iota // zeros: never written, or a format 1 segment without data
	headerV1                         // a format 1 segment: its first frame starts at 0
	headerOK                         // a valid format 2 (or later) header
	headerDamaged                    // a format 2 header whose checksum does not match
)

// parseSegHeader classifies the first segHeaderSize bytes of a segment. A
// header whose magic alone is damaged is still recognised by its checksum.
func parseSegHeader(b []byte) (segHeader, headerState) {
	if len(b) < segHeaderSize || bytes.Equal(b[:segHeaderSize], zeros[:segHeaderSize]) {
		return segHeader{}, headerNone
	}
	h := segHeader{
		version: binary.LittleEndian.Uint32(b[4:]),
		id:      binary.LittleEndian.Uint64(b[8:]),
		size:    int64(binary.LittleEndian.Uint64(b[16:])),
	}
	want := binary.LittleEndian.Uint32(b[28-4:])
	var fixed [28]byte
	copy(fixed[:], b)
	copy(fixed[:4], segMagic)
	if crc32.Checksum(fixed[:24], castagnoli) == want {
		return h, headerOK
	}
	if string(b[:4]) == segMagic {
		return h, headerDamaged
	}
	return segHeader{}, headerV1
}

// readSegHeader reads and classifies the header of f. A damaged header is
// taken for one of the current format: its version field cannot be trusted.
func readSegHeader(f *os.File) (segHeader, headerState, error) {
	var b [segHeaderSize]byte
	n, err := f.ReadAt(b[:], 0)
	if n < len(b) && err != nil && n > 0 {
		// A file shorter than a header: whatever it is, it holds no frame.
		return segHeader{}, headerV1, nil
	}
	if n == 0 {
		return segHeader{}, headerNone, nil
	}
	h, st := parseSegHeader(b[:])
	if st == headerDamaged {
		h.version = FormatVersion
	}
	return h, st, nil
}

// newerError is the one-line refusal of a segment of a newer format.
func newerError(path string, version uint32) error {
	return fmt.Errorf("%w: %s is segment format %d; this keyline reads formats 1 to %d", ErrNewerFormat, path, version, FormatVersion)
}
