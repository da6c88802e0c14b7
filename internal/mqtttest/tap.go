package mqtttest

import (
	"encoding/binary"
	"net"
	"sync"
)

// Tap wraps conn so that every PUBLISH the client reads is reported to
// onPublish the moment its last byte comes off the wire, before any client
// library sees it: a test that records deliveries there records them where
// they happen, not when a callback gets round to them. version is the
// connection's protocol version (4 or 5). onPublish runs on the reader's
// goroutine; its slices are only valid during the call.
func Tap(conn net.Conn, version byte, onPublish func(topic string, payload []byte)) net.Conn {
	return &tapConn{Conn: conn, v5: version == 5, on: onPublish}
}

type tapConn struct {
	net.Conn
	v5 bool
	on func(topic string, payload []byte)

	mu  sync.Mutex
	buf []byte // bytes read but not yet a whole frame
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.buf = append(c.buf, p[:n]...)
		c.parseLocked()
		c.mu.Unlock()
	}
	return n, err
}

// parseLocked reports every complete PUBLISH at the front of buf.
func (c *tapConn) parseLocked() {
	for {
		if len(c.buf) < 2 {
			return
		}
		rem, w := varint(c.buf[1:])
		if w <= 0 {
			return // length not complete yet
		}
		end := 1 + w + rem
		if len(c.buf) < end {
			return
		}
		if c.buf[0]>>4 == 3 { // PUBLISH
			c.publish(c.buf[0], c.buf[1+w:end])
		}
		c.buf = c.buf[end:]
	}
}

func (c *tapConn) publish(header byte, b []byte) {
	if len(b) < 2 {
		return
	}
	tl := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+tl {
		return
	}
	topic := string(b[2 : 2+tl])
	b = b[2+tl:]
	if (header>>1)&3 > 0 { // QoS > 0: packet id
		if len(b) < 2 {
			return
		}
		b = b[2:]
	}
	if c.v5 {
		pl, w := varint(b)
		if w <= 0 || len(b) < w+pl {
			return
		}
		b = b[w+pl:]
	}
	c.on(topic, b)
}

// varint reads an MQTT variable byte integer (protobuf's varint layout):
// its value and width, width 0 when b holds only part of it.
func varint(b []byte) (int, int) {
	v, w := binary.Uvarint(b)
	if w <= 0 || w > 4 {
		return 0, 0
	}
	return int(v), w
}
