package conform

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// ErrProtocol is wrapped by every error Inspect returns: the client broke a
// rule of MQTT 5 whose breach is a Protocol Error (reason code 0x82).
var ErrProtocol = errors.New("conform: protocol error")

// ReasonProtocolError is MQTT 5's reason code 0x82, Protocol Error.
const ReasonProtocolError byte = 0x82

type state uint8

const (
	awaitConnect state = iota // the first frame must be a CONNECT
	checking                  // MQTT 5: every frame's head is checked
	passing                   // MQTT 3.1.1 or 3.1, or a stream mochi will close: nothing more to check
)

// keptHead is the largest head buffer a Checker keeps between frames;
// larger ones are dropped once their frame is checked, so an idle connection
// holds no more than this.
const keptHead = 512

// Checker checks the frames one client sends, in order, as they are read
// (see the package doc). It is not safe for concurrent use: one reader
// goroutine feeds it.
type Checker struct {
	// limit: a frame whose remaining length + 1 is over limit (mochi's count
	// for its maximum packet size) passes unchecked and unbuffered: mochi
	// refuses it.
	limit int
	state state
	// skip is how many bytes of the current frame pass without a look.
	skip int
	// head holds the head of a frame that began in an earlier read, once it
	// did not fit that read; need is how many bytes it must hold before it
	// is parsed again (need > len(head) while it is waiting).
	head []byte
	need int
	// peerMax is the client's Maximum Packet Size (0: none given): a reply
	// must fit it [MQTT-3.1.2-24].
	peerMax uint32
	err     error // the protocol error found; Inspect returns it from then on
}

// NewChecker returns a Checker for a connection whose frames may be at most
// maxPacket bytes as mochi counts them (remaining length + 1; 0: no limit,
// beyond MQTT's own 256 MiB).
func NewChecker(maxPacket uint32) *Checker {
	limit := mqttwire.MaxRemaining + 1
	if maxPacket > 0 && int64(maxPacket) < int64(limit) {
		limit = int(maxPacket)
	}
	return &Checker{limit: limit}
}

// Inspect checks b, the next bytes read from the client. Without a protocol
// error it returns len(b), nil, nil. Otherwise it returns how many bytes of
// b come before the frame that breaks the rules (pass them on, then end the
// connection), the frame to send the client (CONNACK or DISCONNECT 0x82,
// with a Reason String when it fits the client's Maximum Packet Size) and an
// error wrapping ErrProtocol. A Checker that has returned an error returns
// it again, with no reply.
func (c *Checker) Inspect(b []byte) (pass int, reply []byte, err error) {
	if c.err != nil {
		return 0, nil, c.err
	}
	pos := 0
	for pos < len(b) && c.state != passing {
		if c.skip > 0 {
			n := min(c.skip, len(b)-pos)
			c.skip -= n
			pos += n
			continue
		}
		if c.need > 0 { // a head that began in an earlier read
			more := min(c.need-len(c.head), len(b)-pos)
			c.head = append(c.head, b[pos:pos+more]...)
			pos += more
			if len(c.head) < c.need {
				break
			}
			n, v := c.parse(c.head)
			if n > len(c.head) {
				c.need = n
				continue
			}
			c.skip = max(0, c.skip-(len(c.head)-n)) // bytes taken beyond a head found unreadable
			c.need = 0
			c.head = c.head[:0]
			if cap(c.head) > keptHead {
				c.head = nil
			}
			if v.reason != "" {
				reply, err := c.fail(v)
				return 0, reply, err // the frame began before b: none of b passes
			}
			continue
		}
		if c.state == checking {
			if n := c.publish(b[pos:]); n > 0 {
				pos += n
				continue
			}
		}
		n, v := c.parse(b[pos:])
		if n > len(b)-pos {
			c.head = append(c.head[:0], b[pos:]...)
			c.need = n
			break
		}
		if v.reason != "" {
			reply, err := c.fail(v)
			return pos, reply, err
		}
		pos += n
	}
	return len(b), nil, nil
}

// publish is parse's fast path for the frame a client sends most: an MQTT 5
// PUBLISH whose head lies whole in b, within the size limit, that follows
// the rules. It returns the head's length, or 0 for any other frame (parse
// then reads it, and says what is wrong with it).
func (c *Checker) publish(b []byte) int {
	if len(b) < 3 || b[0]>>4 != mqttwire.TypePublish {
		return 0
	}
	var rem, p int
	switch {
	case b[1] < 0x80:
		rem, p = int(b[1]), 2
	case b[2] < 0x80:
		rem, p = int(b[1]&0x7f)|int(b[2])<<7, 3
	default:
		return 0
	}
	end, qos := p+rem, b[0]>>1&0x03
	if rem+1 > c.limit || qos == 3 {
		return 0
	}
	avail := min(end, len(b))
	if p+2 > avail {
		return 0
	}
	p += 2 + int(binary.BigEndian.Uint16(b[p:])) // topic
	if qos > 0 {
		p += 2 // packet id
	}
	if p >= avail {
		return 0
	}
	if b[p] == 0 { // no properties
		p++
	} else {
		n, size, err := mqttwire.ReadVarint(b[p:avail])
		if err != nil || p+size+n > avail {
			return 0
		}
		if c.checkBlock(mqttwire.TypePublish, mqttwire.RawProperties(b[p+size:p+size+n]), false, "") != "" {
			return 0
		}
		p += size + n
	}
	c.skip = end - p
	return p
}

// violation is a frame's breach of the rules; an empty reason means none.
type violation struct {
	typ    byte // the frame's packet type
	reason string
}

// parse reads the head of the frame at the front of b. It returns the
// bytes b must hold before it can go on (more than len(b)), or the head's
// length and, for a frame that breaks the rules, why. Only a finished parse
// changes c.
func (c *Checker) parse(b []byte) (n int, v violation) {
	h := head{b: b, end: mqttwire.MaxRemaining + 5}
	h.take(1)
	rem := h.varint()
	if h.need > 0 {
		return h.need, v
	}
	connect := c.state == awaitConnect
	if h.bad { // a fixed header longer than five bytes: mochi closes the connection
		c.state = passing
		return h.p, v
	}
	typ, flags := b[0]>>4, b[0]&0x0f
	size := h.p
	h.end = size + rem
	if rem+1 > c.limit { // mochi refuses it before reading its body, and closes the connection
		c.skip, c.state = rem, passing
		return size, v
	}
	bl := parseHead(&h, typ, flags, connect)
	if h.need > 0 {
		return h.need, v
	}
	if h.bad { // malformed: mochi's to refuse
		c.skip = rem
		return size, v
	}
	c.skip = h.end - h.p
	if connect {
		c.state = passing
		if bl.isConnect && bl.version == mqttwire.Version5 {
			c.state = checking
		}
	}
	return h.p, violation{typ: typ, reason: c.check(typ, bl)}
}

// check returns why the property blocks of a frame of type typ break the
// rules, or "".
func (c *Checker) check(typ byte, bl blocks) string {
	if reason := c.checkBlock(typ, bl.props, bl.isConnect, ""); reason != "" {
		return reason
	}
	return c.checkBlock(typ, bl.will, false, " will properties")
}

// checkBlock checks one property block. A malformed block is left to mochi:
// the walk stops at the first property it cannot read.
func (c *Checker) checkBlock(typ byte, r mqttwire.RawProperties, connect bool, where string) string {
	var seen uint64 // bit id: property id seen in this block (ids are below 64)
	for len(r) > 0 {
		id, rest, ok := r.Skip()
		if !ok {
			return ""
		}
		if id != mqttwire.PropUserProperty { // the one property a client may repeat
			if seen&(1<<id) != 0 {
				return fmt.Sprintf("%s%s: %s appears more than once", mqttwire.TypeName(typ), where, mqttwire.PropName(id))
			}
			seen |= 1 << id
		}
		if connect && (id == mqttwire.PropReceiveMaximum || id == mqttwire.PropMaximumPacketSize) {
			p, _, _ := r.Next() // well formed: Skip read it
			if p.Uint() == 0 {
				return fmt.Sprintf("CONNECT: %s is 0", mqttwire.PropName(id))
			}
			if id == mqttwire.PropMaximumPacketSize {
				c.peerMax = p.Uint()
			}
		}
		r = rest
	}
	return ""
}

// fail records a protocol error and builds the reply: CONNACK 0x82 to a
// CONNECT, DISCONNECT 0x82 to any other packet.
func (c *Checker) fail(v violation) ([]byte, error) {
	c.err = fmt.Errorf("%w: %s", ErrProtocol, v.reason)
	c.state = passing
	typ, body := mqttwire.TypeDisconnect, []byte{ReasonProtocolError}
	if v.typ == mqttwire.TypeConnect { // only the first CONNECT is checked
		typ, body = mqttwire.TypeConnack, []byte{0, ReasonProtocolError} // no session present
	}
	props := mqttwire.Properties{ReasonString: v.reason}
	if c.peerMax > 0 && uint32(len(body)+len(v.reason)+10) > c.peerMax { // 10: fixed header, block length, property id and string length, at most
		props.ReasonString = ""
	}
	body = mqttwire.AppendProperties(body, &props)
	return append(mqttwire.AppendHeader(nil, typ, 0, len(body)), body...), c.err
}
