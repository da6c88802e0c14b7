package main

// Hand-encoded MQTT 3.1.1 / 5 frames. The load generator never uses a client
// library on a hot path: publishers append frames to one byte slice and write
// it with one syscall, subscribers decode frames in place from a bufio.Reader.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// MQTT control packet types (high nibble of the first byte).
const (
	pktConnect     = 1
	pktConnack     = 2
	pktPublish     = 3
	pktPuback      = 4
	pktPubrec      = 5
	pktPubrel      = 6
	pktPubcomp     = 7
	pktSubscribe   = 8
	pktSuback      = 9
	pktUnsubscribe = 10
	pktUnsuback    = 11
	pktPingreq     = 12
	pktPingresp    = 13
	pktDisconnect  = 14
	pktAuth        = 15
)

// MQTT 5 property identifiers this tool writes or reads.
const (
	propReceiveMaximum = 0x21
	propUserProperty   = 0x26
)

var (
	errMalformed   = errors.New("malformed packet")
	errLengthLimit = errors.New("remaining length over 256 MiB")
)

// appendVarint appends an MQTT variable byte integer.
func appendVarint(b []byte, n int) []byte {
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

func varintLen(n int) int {
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

// readVarint decodes a variable byte integer from b, returning the value and
// the bytes used (0 if b is too short or the integer is malformed).
func readVarint(b []byte) (int, int) {
	n, mul := 0, 1
	for i := 0; i < 4 && i < len(b); i++ {
		n += int(b[i]&0x7f) * mul
		if b[i]&0x80 == 0 {
			return n, i + 1
		}
		mul *= 128
	}
	return 0, 0
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendUint16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }

// appendConnect appends a CONNECT with a clean start, the given keep-alive
// and no will, username or password.
func appendConnect(b []byte, proto byte, clientID string, keepalive uint16) []byte {
	rl := 2 + 4 + 1 + 1 + 2 + 2 + len(clientID)
	if proto == 5 {
		rl++ // empty property set
	}
	b = append(b, pktConnect<<4)
	b = appendVarint(b, rl)
	b = appendString(b, "MQTT")
	b = append(b, proto, 0x02) // level, flags: clean session / clean start
	b = appendUint16(b, keepalive)
	if proto == 5 {
		b = append(b, 0)
	}
	return appendString(b, clientID)
}

// appendSubscribe appends a SUBSCRIBE for one filter at the given QoS.
func appendSubscribe(b []byte, proto byte, id uint16, filter string, qos byte) []byte {
	rl := 2 + 2 + len(filter) + 1
	if proto == 5 {
		rl++
	}
	b = append(b, pktSubscribe<<4|0x02)
	b = appendVarint(b, rl)
	b = appendUint16(b, id)
	if proto == 5 {
		b = append(b, 0)
	}
	b = appendString(b, filter)
	return append(b, qos)
}

// publishLen is the size of the PUBLISH frame appendPublish writes.
func publishLen(proto byte, topic string, qos byte, keyProp string, payload int) int {
	rl := publishRemaining(proto, topic, qos, keyProp, payload)
	return 1 + varintLen(rl) + rl
}

func publishRemaining(proto byte, topic string, qos byte, keyProp string, payload int) int {
	rl := 2 + len(topic) + payload
	if qos > 0 {
		rl += 2
	}
	if proto == 5 {
		pl := propsLen(keyProp)
		rl += varintLen(pl) + pl
	}
	return rl
}

func propsLen(keyProp string) int {
	if keyProp == "" {
		return 0
	}
	return 1 + 2 + len("key") + 2 + len(keyProp)
}

// appendPublish appends a PUBLISH frame and returns it together with the
// offset of the payload inside b. With proto 5 and a non-empty keyProp it
// carries the user property key=keyProp. The payload bytes are not cleared:
// the caller fills them through the returned offset.
func appendPublish(b []byte, proto byte, topic string, qos byte, id uint16, keyProp string, payload int) ([]byte, int) {
	rl := publishRemaining(proto, topic, qos, keyProp, payload)
	b = append(b, pktPublish<<4|qos<<1)
	b = appendVarint(b, rl)
	b = appendString(b, topic)
	if qos > 0 {
		b = appendUint16(b, id)
	}
	if proto == 5 {
		b = appendVarint(b, propsLen(keyProp))
		if keyProp != "" {
			b = append(b, propUserProperty)
			b = appendString(b, "key")
			b = appendString(b, keyProp)
		}
	}
	off := len(b)
	b = slices.Grow(b, payload)[:off+payload]
	return b, off
}

// appendAck appends a PUBACK, PUBREC, PUBREL or PUBCOMP (success, 2 bytes of
// remaining length, valid in 3.1.1 and 5).
func appendAck(b []byte, typ byte, id uint16) []byte {
	h := typ << 4
	if typ == pktPubrel {
		h |= 0x02
	}
	return append(b, h, 2, byte(id>>8), byte(id))
}

func appendDisconnect(b []byte) []byte { return append(b, pktDisconnect<<4, 0) }

func appendPingreq(b []byte) []byte { return append(b, pktPingreq<<4, 0) }

// packet is one decoded frame. body aliases the reader's buffer and is valid
// only until the next call to frameReader.next.
type packet struct {
	typ   byte
	flags byte
	body  []byte
}

// frameReader decodes MQTT frames in place from a bufio.Reader.
type frameReader struct {
	br      *bufio.Reader
	pending int    // bytes of the previous packet still to discard
	scratch []byte // for packets larger than the reader's buffer
}

func newFrameReader(r io.Reader, size int) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(r, size)}
}

// buffered reports whether a further packet (or part of one) is already
// buffered, i.e. next will not block on the socket for its first byte.
func (fr *frameReader) buffered() bool { return fr.br.Buffered() > fr.pending }

func (fr *frameReader) next() (packet, error) {
	if fr.pending > 0 {
		if _, err := fr.br.Discard(fr.pending); err != nil {
			return packet{}, err
		}
		fr.pending = 0
	}
	var hdr []byte
	var rl, n int
	for i := 2; ; i++ {
		h, err := fr.br.Peek(i)
		if err != nil {
			return packet{}, err
		}
		if h[i-1]&0x80 == 0 {
			hdr = h
			rl, n = readVarint(h[1:])
			if n == 0 {
				return packet{}, errMalformed
			}
			break
		}
		if i == 5 {
			return packet{}, errLengthLimit
		}
	}
	p := packet{typ: hdr[0] >> 4, flags: hdr[0] & 0x0f}
	total := 1 + n + rl
	if total <= fr.br.Size() {
		full, err := fr.br.Peek(total)
		if err != nil {
			return packet{}, err
		}
		p.body = full[1+n:]
		fr.pending = total
		return p, nil
	}
	if _, err := fr.br.Discard(1 + n); err != nil {
		return packet{}, err
	}
	if cap(fr.scratch) < rl {
		fr.scratch = make([]byte, rl)
	}
	p.body = fr.scratch[:rl]
	if _, err := io.ReadFull(fr.br, p.body); err != nil {
		return packet{}, err
	}
	return p, nil
}

// publish is a decoded PUBLISH; slices alias the packet body.
type publish struct {
	qos     byte
	dup     bool
	retain  bool
	id      uint16
	topic   []byte
	keyProp []byte // MQTT 5 user property "key", nil if absent
	hasKey  bool
	payload []byte
}

func decodePublish(p packet, proto byte) (publish, error) {
	var m publish
	m.qos = (p.flags >> 1) & 3
	m.dup = p.flags&0x08 != 0
	m.retain = p.flags&0x01 != 0
	b := p.body
	if len(b) < 2 {
		return m, errMalformed
	}
	tl := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+tl {
		return m, errMalformed
	}
	m.topic = b[2 : 2+tl]
	b = b[2+tl:]
	if m.qos > 0 {
		if len(b) < 2 {
			return m, errMalformed
		}
		m.id = binary.BigEndian.Uint16(b)
		b = b[2:]
	}
	if proto == 5 {
		pl, n := readVarint(b)
		if n == 0 || len(b) < n+pl {
			return m, errMalformed
		}
		props := b[n : n+pl]
		b = b[n+pl:]
		err := walkProps(props, func(id byte, v []byte, k []byte) {
			if id == propUserProperty && string(k) == "key" {
				m.keyProp, m.hasKey = v, true
			}
		})
		if err != nil {
			return m, err
		}
	}
	m.payload = b
	return m, nil
}

// walkProps calls f for each MQTT 5 property in b. For a user property k is
// the name and v the value; for other properties v is the raw value bytes.
func walkProps(b []byte, f func(id byte, v, k []byte)) error {
	for len(b) > 0 {
		id := b[0]
		b = b[1:]
		var n int
		switch id {
		case 0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A: // byte
			n = 1
		case 0x13, 0x21, 0x22, 0x23: // two-byte integer
			n = 2
		case 0x02, 0x11, 0x18, 0x27: // four-byte integer
			n = 4
		case 0x0B: // variable byte integer
			_, n = readVarint(b)
			if n == 0 {
				return errMalformed
			}
		case 0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1A, 0x1C, 0x1F: // string / binary
			if len(b) < 2 {
				return errMalformed
			}
			n = 2 + int(binary.BigEndian.Uint16(b))
			if len(b) < n {
				return errMalformed
			}
			f(id, b[2:n], nil)
			b = b[n:]
			continue
		case propUserProperty:
			if len(b) < 2 {
				return errMalformed
			}
			kl := int(binary.BigEndian.Uint16(b))
			if len(b) < 2+kl+2 {
				return errMalformed
			}
			k := b[2 : 2+kl]
			vl := int(binary.BigEndian.Uint16(b[2+kl:]))
			if len(b) < 4+kl+vl {
				return errMalformed
			}
			f(id, b[4+kl:4+kl+vl], k)
			b = b[4+kl+vl:]
			continue
		default:
			return fmt.Errorf("%w: unknown property 0x%02x", errMalformed, id)
		}
		if len(b) < n {
			return errMalformed
		}
		f(id, b[:n], nil)
		b = b[n:]
	}
	return nil
}

// connack is a decoded CONNACK.
type connack struct {
	code           byte
	receiveMaximum uint16 // 0 if absent
}

func decodeConnack(p packet, proto byte) (connack, error) {
	var c connack
	if p.typ != pktConnack || len(p.body) < 2 {
		return c, fmt.Errorf("%w: expected CONNACK, got type %d", errMalformed, p.typ)
	}
	c.code = p.body[1]
	if proto == 5 && len(p.body) > 2 {
		pl, n := readVarint(p.body[2:])
		if n == 0 || len(p.body) < 2+n+pl {
			return c, errMalformed
		}
		err := walkProps(p.body[2+n:2+n+pl], func(id byte, v, _ []byte) {
			if id == propReceiveMaximum {
				c.receiveMaximum = binary.BigEndian.Uint16(v)
			}
		})
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// decodeSuback returns the packet id and reason codes of a SUBACK.
func decodeSuback(p packet, proto byte) (uint16, []byte, error) {
	if p.typ != pktSuback || len(p.body) < 3 {
		return 0, nil, fmt.Errorf("%w: expected SUBACK, got type %d", errMalformed, p.typ)
	}
	id := binary.BigEndian.Uint16(p.body)
	b := p.body[2:]
	if proto == 5 {
		pl, n := readVarint(b)
		if n == 0 || len(b) < n+pl {
			return 0, nil, errMalformed
		}
		b = b[n+pl:]
	}
	return id, b, nil
}

// ackID returns the packet id of a PUBACK/PUBREC/PUBREL/PUBCOMP and its
// reason code (0 when the short form is used).
func ackID(p packet) (uint16, byte, error) {
	if len(p.body) < 2 {
		return 0, 0, errMalformed
	}
	var rc byte
	if len(p.body) > 2 {
		rc = p.body[2]
	}
	return binary.BigEndian.Uint16(p.body), rc, nil
}
