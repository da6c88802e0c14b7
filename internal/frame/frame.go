// Package frame describes an encoded MQTT PUBLISH packet that many
// connections share by reference, and the edits one connection's copy needs
// when it is written:
//   - patched in place: the packet identifier, the DUP flag and the remaining
//     Message Expiry Interval;
//   - rebuilt (MQTT 5): a topic alias (with or without the topic name), one
//     extra user property, and user properties of one name left out.
//
// A Publish is immutable once parsed: its bytes are shared by every queue
// holding it, and its Topic is a view into them. Edits are appended to a
// writer's own buffer; the payload (the tail of the frame) is never copied
// for a large frame.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// MQTT 5 PUBLISH property identifiers this package reads or writes.
const (
	propPayloadFormat  = 0x01
	propMessageExpiry  = 0x02
	propContentType    = 0x03
	propResponseTopic  = 0x08
	propCorrelation    = 0x09
	propSubscriptionID = 0x0B
	propTopicAlias     = 0x23
	propUser           = 0x26
)

// ErrMalformed is returned by Parse for bytes that are not one whole PUBLISH packet.
var ErrMalformed = errors.New("frame: malformed PUBLISH packet")

// Publish is one encoded PUBLISH packet and the offsets of the fields a
// connection edits.
type Publish struct {
	// B is the whole packet, fixed header included. Never modify it.
	B []byte
	// Topic is the topic name, a view into B (the frame keeps B anyway):
	// whatever keeps it past the frame must keep a copy (the alias table
	// clones it; the conflation index re-points its key at the queued frame
	// and drops it with that frame).
	Topic string
	// Version is the protocol level the packet is encoded for: 4 (MQTT 3.1
	// and 3.1.1 share one encoding) or 5.
	Version byte
	// QoS is the packet's QoS (from the fixed header).
	QoS byte
	// ExpiresAt is when the message expires (unix seconds); 0: never.
	ExpiresAt int64

	topicOff   int32 // offset of the topic's 2-byte length
	pidOff     int32 // offset of the packet identifier; -1 at QoS 0
	propsOff   int32 // offset of the property length varint (MQTT 5); -1 otherwise
	payloadOff int32
	expiryOff  int32 // offset of the 4-byte Message Expiry Interval value; -1 when absent
	hasUser    bool  // the frame carries a user property (StripUser has work to do)
}

// Parse returns the layout of b, an encoded PUBLISH for protocol version
// (3 and 4 parse alike). expiresAt is the absolute expiry (unix seconds, 0:
// none) that the encoded Message Expiry Interval stands for. b is kept, not copied.
func Parse(b []byte, version byte, expiresAt int64) (*Publish, error) {
	if version < 5 {
		version = 4
	}
	if len(b) < 2 || b[0]>>4 != 3 {
		return nil, fmt.Errorf("%w: not a PUBLISH", ErrMalformed)
	}
	qos := (b[0] >> 1) & 3
	if qos == 3 {
		return nil, fmt.Errorf("%w: QoS 3", ErrMalformed)
	}
	rem, n := uvarint(b[1:])
	if n <= 0 || 1+n+rem != len(b) {
		return nil, fmt.Errorf("%w: remaining length", ErrMalformed)
	}
	p := &Publish{B: b, Version: version, QoS: qos, ExpiresAt: expiresAt, pidOff: -1, propsOff: -1, expiryOff: -1}
	off := 1 + n
	p.topicOff = int32(off)
	if off+2 > len(b) {
		return nil, fmt.Errorf("%w: topic length", ErrMalformed)
	}
	tl := int(binary.BigEndian.Uint16(b[off:]))
	off += 2
	if off+tl > len(b) {
		return nil, fmt.Errorf("%w: topic", ErrMalformed)
	}
	if tl > 0 {
		p.Topic = unsafe.String(&b[off], tl)
	}
	off += tl
	if qos > 0 {
		if off+2 > len(b) {
			return nil, fmt.Errorf("%w: packet identifier", ErrMalformed)
		}
		p.pidOff = int32(off)
		off += 2
	}
	if version == 5 {
		p.propsOff = int32(off)
		pl, n := uvarint(b[off:])
		if n <= 0 || off+n+pl > len(b) {
			return nil, fmt.Errorf("%w: property length", ErrMalformed)
		}
		off += n
		end := off + pl
		for off < end {
			id := b[off]
			off++
			var size int
			switch id {
			case propPayloadFormat:
				size = 1
			case propMessageExpiry:
				p.expiryOff, size = int32(off), 4
			case propTopicAlias:
				return nil, fmt.Errorf("%w: a shared frame must not carry a topic alias", ErrMalformed)
			case propContentType, propResponseTopic, propCorrelation:
				size = strAt(b, off, end)
			case propUser:
				p.hasUser = true
				if size = strAt(b, off, end); size > 0 {
					if v := strAt(b, off+size, end); v > 0 {
						size += v
					} else {
						size = -1
					}
				}
			case propSubscriptionID:
				_, vn := uvarint(b[off:end])
				size = vn
			default:
				return nil, fmt.Errorf("%w: property 0x%02x", ErrMalformed, id)
			}
			if size <= 0 || off+size > end {
				return nil, fmt.Errorf("%w: property 0x%02x", ErrMalformed, id)
			}
			off += size
		}
	}
	p.payloadOff = int32(off)
	return p, nil
}

// strAt returns the size of the length-prefixed string or binary at
// b[off:] (2 + its length), or -1 when it does not end before end.
func strAt(b []byte, off, end int) int {
	if off+2 > end {
		return -1
	}
	n := 2 + int(binary.BigEndian.Uint16(b[off:]))
	if off+n > end {
		return -1
	}
	return n
}

// uvarint decodes an MQTT variable byte integer; n <= 0 when malformed.
func uvarint(b []byte) (v, n int) {
	mult := 1
	for i := 0; i < 4 && i < len(b); i++ {
		v += int(b[i]&0x7f) * mult
		if b[i]&0x80 == 0 {
			return v, i + 1
		}
		mult <<= 7
	}
	return 0, -1
}

func appendVarint(b []byte, v int) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if v == 0 {
			return b
		}
	}
}

func varintLen(v int) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// Payload returns the payload, a view into B.
func (p *Publish) Payload() []byte { return p.B[p.payloadOff:] }

// HasExpiry reports whether the frame carries a Message Expiry Interval.
func (p *Publish) HasExpiry() bool { return p.expiryOff >= 0 }

// Edit is how one connection's copy of a Publish differs from it.
type Edit struct {
	ID  uint16 // packet identifier (QoS 1 and 2)
	Dup bool   // DUP flag (a resend)
	// Now (unix seconds) sets the remaining Message Expiry Interval of a
	// frame that has one, at least 1 s; 0 leaves the encoded value.
	Now int64
	// Alias (MQTT 5) adds a Topic Alias property; with AliasOnly the topic
	// name is left out (the client knows the alias already).
	Alias     uint16
	AliasOnly bool
	// User (MQTT 5) is one encoded user property appended to the properties
	// (see AppendUserProperty).
	User []byte
	// Strip holds the spans of B (user properties) left out, set by StripUser.
	Strip []Span
}

// Span is a range [From, To) of a frame's bytes.
type Span struct{ From, To int32 }

// stripped returns the bytes Strip leaves out before offset off of B.
func (e *Edit) stripped(off int32) int {
	n := 0
	for _, s := range e.Strip {
		if s.To <= off {
			n += int(s.To - s.From)
		}
	}
	return n
}

// StripUser sets e to leave out p's user properties named key, and reports
// whether it has any. e.Strip is reused.
func (p *Publish) StripUser(e *Edit, key string) bool {
	e.Strip = e.Strip[:0]
	if !p.hasUser {
		return false
	}
	_, n := uvarint(p.B[p.propsOff:])
	b, off, end := p.B, int(p.propsOff)+n, int(p.payloadOff)
	for off < end { // Parse checked the block
		id, start := b[off], off
		off++
		switch id {
		case propPayloadFormat:
			off++
		case propMessageExpiry:
			off += 4
		case propContentType, propResponseTopic, propCorrelation:
			off += strAt(b, off, end)
		case propSubscriptionID:
			_, vn := uvarint(b[off:end])
			off += vn
		case propUser:
			kl := strAt(b, off, end)
			k := b[off+2 : off+kl]
			off += kl
			off += strAt(b, off, end)
			if string(k) == key {
				e.Strip = append(e.Strip, Span{int32(start), int32(off)})
			}
		}
	}
	return len(e.Strip) > 0
}

// rebuilds reports whether e changes the frame's length.
func (p *Publish) rebuilds(e *Edit) bool {
	return p.Version == 5 && (e.Alias != 0 || len(e.User) > 0 || len(e.Strip) > 0)
}

// Size returns the length of the edited frame.
func (p *Publish) Size(e *Edit) int {
	if !p.rebuilds(e) {
		return len(p.B)
	}
	rem := p.remaining(e)
	return 1 + varintLen(rem) + rem
}

// remaining returns the remaining length of the rebuilt frame.
func (p *Publish) remaining(e *Edit) int {
	props := p.propsLen(e)
	rem := 2 + len(p.Topic) + varintLen(props) + props + len(p.B) - int(p.payloadOff)
	if e.AliasOnly {
		rem -= len(p.Topic)
	}
	if p.pidOff >= 0 {
		rem += 2
	}
	return rem
}

// propsLen returns the property length of the rebuilt frame.
func (p *Publish) propsLen(e *Edit) int {
	_, n := uvarint(p.B[p.propsOff:])
	props := int(p.payloadOff-p.propsOff) - n + len(e.User) - e.stripped(p.payloadOff)
	if e.Alias != 0 {
		props += 3
	}
	return props
}

// AppendEdited appends the edited frame to dst. When whole is false and
// the frame is not rebuilt, only the head (up to the last patched byte) is
// appended and tail is the rest of B, to be sent as is; when rebuilt, tail is
// the payload. With whole set (worth it for small frames) everything is
// appended and tail is nil.
func (p *Publish) AppendEdited(dst []byte, e *Edit, whole bool) (out, tail []byte) {
	if p.rebuilds(e) {
		return p.appendRebuilt(dst, e, whole)
	}
	start := len(dst)
	end := len(p.B)
	if !whole {
		end = 1
		if p.pidOff >= 0 {
			end = int(p.pidOff) + 2
		}
		if p.expiryOff >= 0 && e.Now > 0 {
			end = max(end, int(p.expiryOff)+4)
		}
	}
	dst = append(dst, p.B[:end]...)
	h := dst[start:]
	h[0] = p.header(e)
	if p.pidOff >= 0 {
		binary.BigEndian.PutUint16(h[p.pidOff:], e.ID)
	}
	if p.expiryOff >= 0 && e.Now > 0 {
		binary.BigEndian.PutUint32(h[p.expiryOff:], p.remainingExpiry(e.Now))
	}
	if end == len(p.B) {
		return dst, nil
	}
	return dst, p.B[end:]
}

func (p *Publish) header(e *Edit) byte {
	h := p.B[0] &^ 0x08
	if e.Dup && p.QoS > 0 {
		h |= 0x08
	}
	return h
}

func (p *Publish) remainingExpiry(now int64) uint32 {
	return uint32(max(1, p.ExpiresAt-now))
}

func (p *Publish) appendRebuilt(dst []byte, e *Edit, whole bool) (out, tail []byte) {
	dst = append(dst, p.header(e))
	dst = appendVarint(dst, p.remaining(e))
	if e.AliasOnly {
		dst = append(dst, 0, 0)
	} else {
		dst = append(dst, p.B[p.topicOff:int(p.topicOff)+2+len(p.Topic)]...)
	}
	if p.pidOff >= 0 {
		dst = binary.BigEndian.AppendUint16(dst, e.ID)
	}
	dst = appendVarint(dst, p.propsLen(e))
	if e.Alias != 0 {
		dst = append(dst, propTopicAlias)
		dst = binary.BigEndian.AppendUint16(dst, e.Alias)
	}
	_, n := uvarint(p.B[p.propsOff:])
	props, from := len(dst), int32(int(p.propsOff)+n)
	for _, s := range e.Strip {
		dst = append(dst, p.B[from:s.From]...)
		from = s.To
	}
	dst = append(dst, p.B[from:p.payloadOff]...)
	if p.expiryOff >= 0 && e.Now > 0 {
		at := props + int(p.expiryOff) - (int(p.propsOff) + n) - e.stripped(p.expiryOff)
		binary.BigEndian.PutUint32(dst[at:], p.remainingExpiry(e.Now))
	}
	dst = append(dst, e.User...)
	if whole {
		return append(dst, p.B[p.payloadOff:]...), nil
	}
	return dst, p.B[p.payloadOff:]
}

// AppendUserProperty appends the encoding of one MQTT 5 user property.
func AppendUserProperty(dst []byte, key, val string) []byte {
	dst = append(dst, propUser)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(key)))
	dst = append(dst, key...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(val)))
	return append(dst, val...)
}
