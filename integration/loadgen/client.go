package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// mconn is one raw MQTT connection.
type mconn struct {
	c       net.Conn
	fr      *frameReader
	proto   byte
	recvMax uint16 // the broker's Receive Maximum (65535 if it sent none)
}

type dialOpts struct {
	proto     byte
	keepalive uint16
	rcvbuf    int // SO_RCVBUF set before connect (0: kernel default)
	readRate  int // bytes/s the connection reads at most (0: no limit)
	readBuf   int // bufio reader size
	timeout   time.Duration
}

// dialMQTT connects, sends CONNECT and waits for a successful CONNACK.
func dialMQTT(ctx context.Context, addr, clientID string, o dialOpts) (*mconn, error) {
	d := net.Dialer{Timeout: o.timeout}
	if o.rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, o.rcvbuf)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if o.readBuf == 0 {
		o.readBuf = 64 << 10
	}
	m := &mconn{c: c, fr: newFrameReader(c, o.readBuf), proto: o.proto, recvMax: 65535}
	if o.readRate > 0 {
		m.fr = newFrameReader(&rateConn{Conn: c, rate: float64(o.readRate)}, o.readBuf)
	}
	if err := m.handshake(clientID, o); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", clientID, err)
	}
	return m, nil
}

func (m *mconn) handshake(clientID string, o dialOpts) error {
	if o.timeout > 0 {
		m.c.SetDeadline(time.Now().Add(o.timeout))
		defer m.c.SetDeadline(time.Time{})
	}
	if _, err := m.c.Write(appendConnect(nil, o.proto, clientID, o.keepalive)); err != nil {
		return err
	}
	p, err := m.fr.next()
	if err != nil {
		return fmt.Errorf("reading CONNACK: %w", err)
	}
	ca, err := decodeConnack(p, o.proto)
	if err != nil {
		return err
	}
	if ca.code != 0 {
		return fmt.Errorf("CONNACK refused with code 0x%02x", ca.code)
	}
	if ca.receiveMaximum > 0 {
		m.recvMax = ca.receiveMaximum
	}
	return nil
}

// subscribe sends one SUBSCRIBE and waits for its SUBACK.
func (m *mconn) subscribe(filter string, qos byte, timeout time.Duration) error {
	if timeout > 0 {
		m.c.SetDeadline(time.Now().Add(timeout))
		defer m.c.SetDeadline(time.Time{})
	}
	if _, err := m.c.Write(appendSubscribe(nil, m.proto, 1, filter, qos)); err != nil {
		return err
	}
	for {
		p, err := m.fr.next()
		if err != nil {
			return fmt.Errorf("reading SUBACK for %s: %w", filter, err)
		}
		if p.typ != pktSuback {
			// Nothing is published before every subscription is in place,
			// so anything else is a protocol surprise worth reporting.
			return fmt.Errorf("expected SUBACK for %s, got packet type %d", filter, p.typ)
		}
		_, codes, err := decodeSuback(p, m.proto)
		if err != nil {
			return err
		}
		if len(codes) != 1 || codes[0] >= 0x80 {
			return fmt.Errorf("subscription to %s refused: %x", filter, codes)
		}
		return nil
	}
}

func (m *mconn) close() {
	m.c.Write(appendDisconnect(nil))
	m.c.Close()
}

// abort closes with RST (no TIME_WAIT left behind on this side).
func (m *mconn) abort() {
	if tc, ok := m.c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	m.c.Close()
}

// isClosedErr reports whether err is the expected result of closing a
// connection ourselves or the broker closing it at the end of a run.
func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || err.Error() == "EOF"
}
