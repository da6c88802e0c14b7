package conform

import (
	"encoding/binary"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// head reads the head of one frame (fixed header, variable header and the
// property blocks that follow) from the front of b, which may end anywhere.
// Each read either takes its field, or records how many bytes b must hold
// before it can (need), or finds that the field runs past the frame's end
// (bad); after either, every read is a no-op returning zero values, so a
// parse is written as straight-line code and checked once at the end.
type head struct {
	b    []byte
	p    int // bytes taken
	end  int // the frame's size: no field may run past it
	need int // > 0: b must hold this many bytes before parsing again
	bad  bool
}

func (h *head) stopped() bool { return h.need > 0 || h.bad }

// take returns the next n bytes.
func (h *head) take(n int) []byte {
	switch {
	case h.stopped():
		return nil
	case h.p+n > h.end:
		h.bad = true
		return nil
	case h.p+n > len(h.b):
		h.need = h.p + n
		return nil
	}
	v := h.b[h.p : h.p+n : h.p+n]
	h.p += n
	return v
}

func (h *head) byte1() byte {
	if v := h.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (h *head) u16() int {
	if v := h.take(2); v != nil {
		return int(binary.BigEndian.Uint16(v))
	}
	return 0
}

// string skips a string or binary data: its two-byte length, then its bytes.
func (h *head) string() { h.take(h.u16()) }

// varint reads a variable byte integer.
func (h *head) varint() int {
	if h.stopped() {
		return 0
	}
	avail := h.b[h.p:min(len(h.b), h.end)]
	n, size, err := mqttwire.ReadVarint(avail)
	switch {
	case err == mqttwire.ErrIncomplete && h.p+len(avail) < h.end:
		h.need = h.p + len(avail) + 1 // one more byte of it
		return 0
	case err != nil:
		h.bad = true // longer than four bytes, or cut by the frame's end
		return 0
	}
	h.p += size
	return n
}

// props reads a property block: its length, then the properties.
func (h *head) props() mqttwire.RawProperties {
	return mqttwire.RawProperties(h.take(h.varint()))
}

// blocks are the property blocks of one frame's head: at most two (a
// CONNECT's own and its will's).
type blocks struct {
	props, will mqttwire.RawProperties
	isConnect   bool
	version     byte // a CONNECT's protocol level
}

// parseHead reads the head of an MQTT 5 frame of type typ (flags: the low
// nibble of its first byte) whose fixed header h.p has taken.
func parseHead(h *head, typ, flags byte, connect bool) blocks {
	var bl blocks
	rem := h.end - h.p
	switch {
	case typ == mqttwire.TypeConnect && connect:
		bl.isConnect = true
		h.string() // protocol name
		bl.version = h.byte1()
		cflags := h.byte1()
		h.take(2) // keep alive
		if bl.version != mqttwire.Version5 || h.stopped() {
			break // 3.1.1 and 3.1 have no properties
		}
		bl.props = h.props()
		h.string() // client identifier
		if cflags&0x04 != 0 {
			bl.will = h.props()
		}
	case connect:
		// not a CONNECT where one must be: mochi refuses it
	case typ == mqttwire.TypePublish:
		qos := flags >> 1 & 0x03
		if qos == 3 {
			h.bad = true
			break
		}
		h.string() // topic
		if qos > 0 {
			h.take(2) // packet id
		}
		bl.props = h.props()
	case typ >= mqttwire.TypePuback && typ <= mqttwire.TypePubcomp:
		if rem >= 4 { // packet id, reason code, properties; shorter forms have none
			h.take(3)
			bl.props = h.props()
		}
	case typ == mqttwire.TypeSubscribe || typ == mqttwire.TypeUnsubscribe:
		h.take(2) // packet id
		bl.props = h.props()
	case typ == mqttwire.TypeDisconnect || typ == mqttwire.TypeAuth:
		if rem >= 2 { // reason code, properties; shorter forms have none
			h.take(1)
			bl.props = h.props()
		}
	}
	return bl
}
