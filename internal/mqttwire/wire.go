package mqttwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Protocol versions (the CONNECT's protocol level).
const (
	Version311 byte = 4
	Version5   byte = 5
)

// Control packet types (the high nibble of a frame's first byte).
const (
	TypeConnect     byte = 1
	TypeConnack     byte = 2
	TypePublish     byte = 3
	TypePuback      byte = 4
	TypePubrec      byte = 5
	TypePubrel      byte = 6
	TypePubcomp     byte = 7
	TypeSubscribe   byte = 8
	TypeSuback      byte = 9
	TypeUnsubscribe byte = 10
	TypeUnsuback    byte = 11
	TypePingreq     byte = 12
	TypePingresp    byte = 13
	TypeDisconnect  byte = 14
	TypeAuth        byte = 15
)

var typeNames = [16]string{"reserved type 0", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL",
	"PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH"}

// TypeName returns the name of packet type t ("PUBLISH").
func TypeName(t byte) string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("packet type %d", t)
}

// MaxRemaining is the largest remaining length (and variable byte integer)
// MQTT can express: 256 MiB - 1, in four bytes.
const MaxRemaining = 268435455

// MaxString is the longest string or binary data MQTT can carry, in bytes.
const MaxString = 65535

var (
	// ErrMalformed is wrapped by every decoding error: the bytes are not a
	// well-formed MQTT frame.
	ErrMalformed = errors.New("mqttwire: malformed packet")
	// ErrIncomplete is ParseHeader's error while b ends inside the header.
	ErrIncomplete = errors.New("mqttwire: incomplete fixed header")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// AppendVarint appends n as a variable byte integer. n must be in
// 0..MaxRemaining.
func AppendVarint(b []byte, n int) []byte {
	if n < 0 || n > MaxRemaining {
		panic(fmt.Sprintf("mqttwire: variable byte integer %d outside 0..%d", n, MaxRemaining))
	}
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

// VarintLen returns how many bytes AppendVarint writes for n.
func VarintLen(n int) int {
	switch {
	case n < 128:
		return 1
	case n < 16384:
		return 2
	case n < 2097152:
		return 3
	default:
		return 4
	}
}

// ReadVarint decodes a variable byte integer from the front of b and returns
// it with the number of bytes it took. The error is ErrIncomplete when b ends
// inside the integer and wraps ErrMalformed when it runs past four bytes.
func ReadVarint(b []byte) (n, size int, err error) {
	if len(b) > 0 && b[0] < 0x80 {
		return int(b[0]), 1, nil // the common case, inlined
	}
	return readVarint(b)
}

func readVarint(b []byte) (n, size int, err error) {
	mul := 1
	for i := range 4 {
		if i == len(b) {
			return 0, 0, ErrIncomplete
		}
		n += int(b[i]&0x7f) * mul
		if b[i]&0x80 == 0 {
			return n, i + 1, nil
		}
		mul *= 128
	}
	return 0, 0, malformed("variable byte integer longer than four bytes")
}

// AppendString appends s as an MQTT string: a two-byte length, then the
// bytes. s must be at most MaxString bytes.
func AppendString(b []byte, s string) []byte {
	if len(s) > MaxString {
		panic(fmt.Sprintf("mqttwire: string of %d bytes, over the %d an MQTT string holds", len(s), MaxString))
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// AppendBinary appends v as MQTT binary data (the layout of a string). v
// must be at most MaxString bytes.
func AppendBinary(b, v []byte) []byte {
	if len(v) > MaxString {
		panic(fmt.Sprintf("mqttwire: binary data of %d bytes, over the %d MQTT binary data holds", len(v), MaxString))
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
	return append(b, v...)
}

// Header is a frame's fixed header.
type Header struct {
	Type      byte // packet type, TypeConnect..TypeAuth
	Flags     byte // low nibble of the first byte
	Remaining int  // bytes of the body that follows
	Size      int  // bytes of the header itself (2 to 5)
}

// AppendHeader appends a fixed header: typ<<4|flags, then the remaining
// length.
func AppendHeader(b []byte, typ, flags byte, remaining int) []byte {
	return AppendVarint(append(b, typ<<4|flags&0x0f), remaining)
}

// ParseHeader reads the fixed header at the front of b. Its error is
// ErrIncomplete while b ends inside the header; otherwise the frame is the
// first h.Size+h.Remaining bytes of b once that many have arrived.
func ParseHeader(b []byte) (Header, error) {
	if len(b) == 0 {
		return Header{}, ErrIncomplete
	}
	n, size, err := ReadVarint(b[1:])
	if err != nil {
		return Header{}, err
	}
	return Header{Type: b[0] >> 4, Flags: b[0] & 0x0f, Remaining: n, Size: 1 + size}, nil
}

// frameStart grows b for a frame of the given remaining length and appends
// its fixed header.
func frameStart(b []byte, typ, flags byte, remaining int) []byte {
	if remaining > MaxRemaining {
		panic(fmt.Sprintf("mqttwire: %s of %d bytes, over the %d a frame holds", TypeName(typ), remaining, MaxRemaining))
	}
	b = slices.Grow(b, 1+VarintLen(remaining)+remaining)
	return AppendHeader(b, typ, flags, remaining)
}
