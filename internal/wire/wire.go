// Package wire reads and writes the varint-framed records Keyline keeps and
// sends: group log messages and dead letters (keyshared's codec), group
// checkpoints (persistence) and the Key-Shared batches between cluster
// nodes (cluster). One reader that remembers its first error, and the
// helpers that write what it reads.
package wire

import (
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"
)

// Decoder reads a record, remembering the first error; after it every read
// returns zero values.
type Decoder struct {
	b    []byte
	err  error
	base error // wrapped by every error (errors.Is finds it)
}

// NewDecoder reads b; its errors wrap base.
func NewDecoder(b []byte, base error) *Decoder { return &Decoder{b: b, base: base} }

// Err returns the first error.
func (d *Decoder) Err() error { return d.err }

// Fail records that what could not be read (unless an error came first)
// and empties the decoder.
func (d *Decoder) Fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or bad %s", d.base, what)
	}
	d.b = nil
}

// Rest returns what is left to read.
func (d *Decoder) Rest() []byte { return d.b }

// Byte reads one byte.
func (d *Decoder) Byte() byte {
	if len(d.b) < 1 {
		d.Fail("byte")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.Fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Varint reads a signed (zig-zag) varint.
func (d *Decoder) Varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.Fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Bytes reads a length-prefixed field as a capped sub-slice of the buffer
// (an append by the reader copies), nil when empty.
func (d *Decoder) Bytes() []byte {
	n := d.Uvarint()
	if n > uint64(len(d.b)) {
		d.Fail("length")
		return nil
	}
	if n == 0 {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// String reads a length-prefixed field as a new string.
func (d *Decoder) String() string { return string(d.Bytes()) }

// StringView reads a length-prefixed field as a string sharing the buffer's
// memory: only for buffers nobody writes again, and for strings that may
// keep the whole buffer alive as long as they live.
func (d *Decoder) StringView() string {
	b := d.Bytes()
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// Count reads a count of items that take at least one byte each: a count
// larger than what is left fails (so a caller may allocate it).
func (d *Decoder) Count() int {
	n := d.Uvarint()
	if n > uint64(len(d.b)) {
		d.Fail("count")
		return 0
	}
	return int(n)
}

// Done returns the first error, or one for trailing bytes.
func (d *Decoder) Done() error {
	if d.err == nil && len(d.b) > 0 {
		d.Fail("record end (trailing bytes)")
	}
	return d.err
}

// AppendString appends s with its uvarint length.
func AppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// AppendBytes appends b with its uvarint length.
func AppendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// UvarintLen is the length of x as a uvarint.
func UvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// VarintLen is the length of x as a varint.
func VarintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return UvarintLen(ux)
}

// StringLen is the length of a string of n bytes with its uvarint length.
func StringLen(n int) int { return UvarintLen(uint64(n)) + n }

// TimeNanos encodes t as unix nanoseconds, 0 for the zero time (the Unix
// epoch itself therefore reads back as the zero time). Times outside the
// range of int64 nanoseconds (years 1678 to 2262) are clamped.
func TimeNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	const maxSec = (1<<63-1)/int64(time.Second) - 1
	if s := t.Unix(); s >= maxSec {
		return 1<<63 - 1
	} else if s <= -maxSec {
		return -1 << 63
	}
	return t.UnixNano()
}

// TimeFromNanos decodes TimeNanos.
func TimeFromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
