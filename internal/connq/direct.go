package connq

import (
	"errors"
	"net"
)

// The direct path: a frame mochi writes (an ack, CONNACK, PINGRESP, SUBACK)
// to a connection with nothing queued and no writer running is written at
// once, from the caller's goroutine, with one system call that never blocks
// (what the socket does not take is queued, ahead of whatever was queued
// meanwhile, for the writer). An idle device's publish is then answered
// without a writer goroutine being started for its PUBACK.

// errWouldBlock is writeNonblock's answer when the socket takes nothing.
var errWouldBlock = errors.New("connq: socket buffer full")

// direct writes p now if the connection allows it (see above); it reports
// false, having done nothing, when p must be queued. owned says whether the
// queue may keep p itself for a remainder (else it is copied).
func (c *Conn) direct(p []byte, kind entryKind, owned bool) (bool, error) {
	if c.raw == nil || len(p) == 0 {
		return false, nil
	}
	c.mu.Lock()
	if c.closedLocked() != nil || c.mu.scheduled || c.mu.corked > 0 || c.mu.head != len(c.mu.q) || len(c.mu.holds) > 0 || len(p) > c.mu.limits.Hard {
		c.mu.Unlock()
		return false, nil
	}
	if !c.mu.connacked {
		if kind != kindMochi || p[0]>>4 != 2 { // only the CONNACK may go before the CONNACK
			c.mu.Unlock()
			return false, nil
		}
		c.mu.connacked = true
	}
	c.mu.scheduled = true // this goroutine is the writer until it is done
	c.mu.Unlock()

	n, err := writeNonblock(c.raw, p)

	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.scheduled = false
	if n > 0 {
		c.stats.Writes.Add(1)
	}
	switch {
	case err != nil && !errors.Is(err, errWouldBlock):
		c.failLocked(err)
	case n == len(p):
		c.stats.Frames.Add(1)
		if kind == kindSent {
			addInfo(c.stats.InfoMessagesSent, 1)
			addInfo(c.stats.InfoPacketsSent, 1)
			addInfo(c.stats.InfoBytesSent, int64(len(p)))
		}
	default: // the rest goes first when the writer runs
		rest := p[n:]
		if !owned {
			rest = append([]byte(nil), rest...)
		}
		c.mu.q = append(c.mu.q, entry{})
		copy(c.mu.q[c.mu.head+1:], c.mu.q[c.mu.head:])
		c.mu.q[c.mu.head] = entry{b: rest, kind: kind}
		c.mu.bytes += len(rest)
		clear(c.mu.conflate) // positions moved; the index starts over
	}
	if c.mu.head < len(c.mu.q) || c.mu.closing || c.mu.failed != nil {
		c.scheduleLocked() // frames queued meanwhile, a remainder, or the end of the connection
	}
	return true, nil
}

// rawOf returns the raw connection of a TCP connection, for direct writes.
func rawOf(c net.Conn) rawWriter {
	if tc, ok := c.(*net.TCPConn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			return rc
		}
	}
	return nil
}
