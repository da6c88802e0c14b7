package mqtttest

import (
	"net"
	"sync"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// Tap wraps conn so that every PUBLISH the client reads is reported to
// onPublish the moment its last byte comes off the wire, before any client
// library sees it: a test that records deliveries there records them where
// they happen, not when a callback gets round to them. version is the
// connection's protocol version (4 or 5). onPublish runs on the reader's
// goroutine; its slices are only valid during the call.
func Tap(conn net.Conn, version byte, onPublish func(topic string, payload []byte)) net.Conn {
	c := &tapConn{Conn: conn, v5: version == 5, on: onPublish}
	c.packet, _ = conn.(sync.Locker)
	if c.packet == nil {
		c.packet = new(sync.Mutex)
	}
	return c
}

type tapConn struct {
	net.Conn
	v5 bool
	on func(topic string, payload []byte)
	// packet is the write lock paho holds around each packet (it writes one
	// in several Writes, and PINGREQs from another goroutine): the wrapped
	// conn's (Dial's conns have one), so that hiding it does not let a
	// PINGREQ land inside a SUBSCRIBE, as it once did.
	packet sync.Locker

	mu     sync.Mutex
	buf    []byte // bytes read but not yet a whole frame
	broken bool   // a malformed header: the client library will see it too; stop tapping
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if !c.broken {
			c.buf = append(c.buf, p[:n]...)
			c.parseLocked()
		}
		c.mu.Unlock()
	}
	return n, err
}

// parseLocked reports every complete PUBLISH at the front of buf.
func (c *tapConn) parseLocked() {
	version := mqttwire.Version311
	if c.v5 {
		version = mqttwire.Version5
	}
	for {
		h, err := mqttwire.ParseHeader(c.buf)
		if err != nil {
			c.broken = err != mqttwire.ErrIncomplete
			return
		}
		end := h.Size + h.Remaining
		if len(c.buf) < end {
			return
		}
		if h.Type == mqttwire.TypePublish {
			p := mqttwire.Packet{Type: h.Type, Flags: h.Flags, Body: c.buf[h.Size:end]}
			if m, err := mqttwire.DecodePublish(version, p); err == nil {
				c.on(string(m.Topic), m.Payload)
			}
		}
		c.buf = c.buf[end:]
	}
}

// Lock and Unlock make the tap a sync.Locker, which paho.golang takes around
// every packet it writes.
func (c *tapConn) Lock()   { c.packet.Lock() }
func (c *tapConn) Unlock() { c.packet.Unlock() }
