// Keyline's fork: a connection mochi does not read itself, and the compact
// record of an offline session (PATCHES.md).

package mqtt

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/mochi-mqtt/server/v2/packets"
)

// ErrClientStopped is returned by Conn.Feed when the client has been
// stopped (a DISCONNECT it sent, or the server ending it): the connection
// is over without a reading error.
var ErrClientStopped = errors.New("client stopped")

// Conn serves a client connection whose owner reads it: the owner passes
// every byte it reads to Feed, in order, and calls End once, when the
// connection has ended. Together they do what EstablishConnection does for
// a connection mochi reads itself (attach on CONNECT, receivePacket for
// every later packet, detach at the end) with no goroutine of their own:
// between two calls a Conn holds its client and, at most, the bytes of one
// incomplete packet. Feed and End must not be called concurrently.
type Conn struct {
	s        *Server
	cl       *Client
	listener string
	// partial holds the bytes of a packet that has not arrived whole: nil
	// between packets, at most the packet's size (bounded by
	// MaximumPacketSize) while one arrives, grown as its bytes do.
	partial  []byte
	attached bool // the CONNECT was accepted: End runs detach
	ended    bool
}

// NewConn starts serving c, a connection accepted by listener, whose bytes
// its caller will Feed.
func (s *Server) NewConn(listener string, c net.Conn) *Conn {
	s.Listeners.ClientsWg.Add(1)
	s.connOpsOnce.Do(func() { s.connOps = &ops{options: s.Options, info: s.Info, hooks: s.hooks, log: s.Log} })
	cl := newClientReading(c, s.connOps, false)
	cl.Net.Listener = listener
	if !s.Options.DirectWrites {
		go cl.WriteLoop()
	}
	return &Conn{s: s, cl: cl, listener: listener}
}

// Client returns the connection's client.
func (c *Conn) Client() *Client { return c.cl }

// Pending returns how many bytes of an incomplete packet c holds.
func (c *Conn) Pending() int { return len(c.partial) }

// Feed handles b, the next bytes read from the connection: every packet it
// completes is decoded and handled, and the bytes of a packet still
// incomplete are copied (b is not kept: the caller may reuse it). An error
// means the connection must end: the caller stops reading and calls End
// with it. After a packet that stops the client (a DISCONNECT) Feed returns
// ErrClientStopped and ignores what follows.
func (c *Conn) Feed(b []byte) error {
	if c.ended {
		return ErrConnectionClosed
	}
	if len(c.partial) > 0 {
		n, done, err := c.completePartial(b)
		if err != nil {
			return err
		}
		b = b[n:]
		if !done {
			return nil
		}
		px := c.partial
		c.partial = nil
		if err := c.handle(px, true); err != nil {
			return err
		}
	}
	for len(b) > 0 {
		total, err := c.frameSize(b)
		if err != nil {
			return err
		}
		if total == 0 || total > len(b) { // incomplete: keep its bytes
			c.partial = append(make([]byte, 0, max(len(b), 16)), b...)
			return nil
		}
		if err := c.handle(b[:total], false); err != nil {
			return err
		}
		b = b[total:]
	}
	return nil
}

// completePartial moves bytes from b into the incomplete packet until it is
// whole or b is used up; it returns how many it took and whether the packet
// is whole.
func (c *Conn) completePartial(b []byte) (int, bool, error) {
	used := 0
	for {
		total, err := c.frameSize(c.partial)
		if err != nil {
			return used, false, err
		}
		if total == 0 { // the fixed header is incomplete: one more byte
			if used == len(b) {
				return used, false, nil
			}
			c.partial = append(c.partial, b[used])
			used++
			continue
		}
		n := min(total-len(c.partial), len(b)-used)
		c.partial = append(c.partial, b[used:used+n]...)
		used += n
		return used, len(c.partial) == total, nil
	}
}

// frameSize reads the fixed header at the start of b and returns the
// frame's whole size, or 0 if b does not hold the whole fixed header yet.
// It refuses what ReadFixedHeader and readConnectionPacket refuse, before
// the body arrives: a malformed header, a first packet that is no CONNECT,
// a packet over MaximumPacketSize.
func (c *Conn) frameSize(b []byte) (int, error) {
	n, err := c.readFixedHeader(b)
	if err != nil && !c.attached {
		err = fmt.Errorf("read connection: %w", err)
	}
	return n, err
}

func (c *Conn) readFixedHeader(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var fh packets.FixedHeader
	if err := fh.Decode(b[0]); err != nil {
		return 0, err
	}
	if !c.attached && fh.Type != packets.Connect {
		return 0, packets.ErrProtocolViolationRequireFirstConnect // [MQTT-3.1.0-1]
	}
	rem, mul := 0, 1
	for i := 1; ; i++ {
		if i > 4 {
			return 0, packets.ErrMalformedVariableByteInteger
		}
		if i >= len(b) {
			return 0, nil
		}
		rem += int(b[i]&0x7f) * mul
		if b[i]&0x80 == 0 {
			if max := c.s.Options.Capabilities.MaximumPacketSize; max > 0 && uint32(rem+1) > max {
				return 0, packets.ErrPacketTooLarge // [MQTT-3.2.2-15]
			}
			return i + 1 + rem, nil
		}
		mul *= 128
	}
}

// handle decodes and handles one whole frame. The body is copied unless
// owned: the frame is the Conn's own buffer (an incomplete packet
// completed), which the packet then keeps.
func (c *Conn) handle(frame []byte, owned bool) error {
	cl := c.cl
	var pk packets.Packet
	_ = pk.FixedHeader.Decode(frame[0]) // checked by frameSize
	hdr := 2
	for frame[hdr-1]&0x80 != 0 {
		hdr++
	}
	pk.FixedHeader.Remaining = len(frame) - hdr
	pk.ProtocolVersion = cl.Properties.ProtocolVersion
	atomic.AddInt64(&cl.ops.info.PacketsReceived, 1)
	atomic.AddInt64(&cl.ops.info.BytesReceived, int64(len(frame)))
	body := frame[hdr:]
	if !owned {
		body = append([]byte(nil), body...) // the caller reuses its buffer; the packet keeps views into the body
	}
	if err := cl.decodePacket(&pk, body); err != nil {
		if !c.attached {
			return fmt.Errorf("read connection: %w", err)
		}
		return err
	}
	if !c.attached {
		if err := c.s.attach(cl, c.listener, pk); err != nil {
			return err
		}
		c.attached = true
	} else if err := c.s.receivePacket(cl, pk); err != nil {
		return err
	}
	if cl.Closed() {
		return ErrClientStopped
	}
	cl.refreshDeadline(cl.State.Keepalive)
	return nil
}

// End finishes the connection after it ended with err (Feed's error, a
// read error, a timeout; nil or ErrClientStopped: ended by the client or
// the server). For an attached client it sends the will unless the client
// disconnected normally, runs the OnDisconnect hooks and ends or keeps the
// session, as EstablishConnection does when its reading ends. It returns
// the connection's error, as EstablishConnection would.
func (c *Conn) End(err error) error {
	if c.ended {
		return nil
	}
	c.ended = true
	c.partial = nil
	defer c.s.Listeners.ClientsWg.Done()
	defer c.cl.Stop(nil)
	if !c.attached {
		return err
	}
	if errors.Is(err, ErrClientStopped) {
		err = nil
	}
	return c.s.detach(c.cl, c.listener, err)
}

// offline returns the compact record of cl's session, to keep in Clients
// in place of cl once its connection has ended: the session's state
// (subscriptions, in-flight messages, packet ids, properties, will, expiry
// clock) and none of the connection's (no net.Conn, reader, write queue,
// topic aliases or context). It reports itself closed (Closed, StopTime,
// StopCause as cl did), and stopping it again does nothing. Topic aliases
// end with their connection [MQTT-3.3.2-7], so the record allows none.
func (cl *Client) offline() *Client {
	o := &Client{ID: cl.ID, ops: cl.ops, Properties: cl.Properties}
	o.Properties.Props.TopicAliasMaximum = 0
	o.Net = ClientConnection{Remote: cl.Net.Remote, Listener: cl.Net.Listener, Inline: cl.Net.Inline}
	o.State.Inflight = cl.State.Inflight
	o.State.Subscriptions = cl.State.Subscriptions
	o.State.Keepalive = cl.State.Keepalive
	o.State.ServerKeepalive = cl.State.ServerKeepalive
	o.State.packetID = atomic.LoadUint32(&cl.State.packetID)
	o.State.disconnected.Store(cl.StopTime())
	o.State.stoppedAt.Store(cl.State.stoppedAt.Load())
	if cause := cl.StopCause(); cause != nil {
		o.State.stopCause.Store(cause)
	}
	o.State.endOnce.Do(func() {}) // stopped already: Stop does nothing
	return o                      // State.open is false: Closed reports true
}

// replace puts cl in place of old, if old is still the client of its id.
func (cl *Clients) replace(old, client *Client) {
	cl.Lock()
	defer cl.Unlock()
	if cur, ok := cl.internal[old.ID]; ok && cur == old {
		cl.internal[old.ID] = client
	}
}

// collect returns the clients for which keep reports true; keep runs under
// the clients' read lock, so it must not call back into Clients.
func (cl *Clients) collect(keep func(*Client) bool) []*Client {
	cl.RLock()
	defer cl.RUnlock()
	var out []*Client
	for _, c := range cl.internal {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// deleteIf deletes client, if it is still the client of its id.
func (cl *Clients) deleteIf(client *Client) {
	cl.Lock()
	defer cl.Unlock()
	if cur, ok := cl.internal[client.ID]; ok && cur == client {
		delete(cl.internal, client.ID)
	}
}
