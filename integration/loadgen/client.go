package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// mconn is one raw MQTT connection.
type mconn struct {
	c       net.Conn
	fr      *mqttwire.Reader
	proto   byte
	recvMax uint16 // the broker's Receive Maximum (65535 if it sent none)
	present bool   // the CONNACK's session present flag
}

type dialOpts struct {
	proto byte
	// persistent asks for a session that outlives the connection (3.1.1
	// clean session 0; MQTT 5 session expiry of an hour).
	persistent bool
	keepalive  uint16
	rcvbuf     int // SO_RCVBUF set before connect (0: kernel default)
	readRate   int // bytes/s the connection reads at most (0: no limit)
	readBuf    int // bufio reader size
	timeout    time.Duration
	transport  string // tcp (default), tls or ws
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
	c, err := dialTransport(ctx, o.transport, addr, &d)
	if err != nil {
		return nil, err
	}
	if o.readBuf == 0 {
		o.readBuf = 64 << 10
	}
	m := &mconn{c: c, fr: mqttwire.NewReader(c, o.readBuf), proto: o.proto, recvMax: 65535}
	if o.readRate > 0 {
		m.fr = mqttwire.NewReader(&rateConn{Conn: c, rate: float64(o.readRate)}, o.readBuf)
	}
	if m.present, err = m.handshake(clientID, o); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", clientID, err)
	}
	return m, nil
}

// handshake sends CONNECT and reads a successful CONNACK; it returns the
// CONNACK's session present flag.
func (m *mconn) handshake(clientID string, o dialOpts) (bool, error) {
	if o.timeout > 0 {
		m.c.SetDeadline(time.Now().Add(o.timeout))
		defer m.c.SetDeadline(time.Time{})
	}
	connect := &mqttwire.Connect{Version: o.proto, ClientID: clientID, CleanStart: !o.persistent, KeepAlive: o.keepalive}
	if o.persistent && o.proto == mqttwire.Version5 {
		connect.Props.SessionExpiry = 3600
	}
	if _, err := m.c.Write(mqttwire.AppendConnect(nil, connect)); err != nil {
		return false, err
	}
	p, err := m.fr.Next()
	if err != nil {
		return false, fmt.Errorf("reading CONNACK: %w", err)
	}
	ca, err := mqttwire.DecodeConnack(o.proto, p)
	if err != nil {
		return false, err
	}
	if ca.ReasonCode != 0 {
		return false, fmt.Errorf("CONNACK refused with code 0x%02x", ca.ReasonCode)
	}
	props, err := ca.Props.Parse()
	if err != nil {
		return false, err
	}
	if props.ReceiveMaximum > 0 {
		m.recvMax = props.ReceiveMaximum
	}
	return ca.SessionPresent, nil
}

// subscribe sends one SUBSCRIBE and waits for its SUBACK.
func (m *mconn) subscribe(filter string, qos byte, timeout time.Duration) error {
	if timeout > 0 {
		m.c.SetDeadline(time.Now().Add(timeout))
		defer m.c.SetDeadline(time.Time{})
	}
	sub := &mqttwire.Subscribe{PacketID: 1, Filters: []mqttwire.Subscription{{Filter: filter, Options: qos}}}
	if _, err := m.c.Write(mqttwire.AppendSubscribe(nil, m.proto, sub)); err != nil {
		return err
	}
	var p mqttwire.Packet
	for {
		var err error
		if p, err = m.fr.Next(); err != nil {
			return fmt.Errorf("reading SUBACK for %s: %w", filter, err)
		}
		if p.Type == mqttwire.TypeSuback {
			break
		}
		if p.Type != mqttwire.TypePublish {
			return fmt.Errorf("expected SUBACK for %s, got %s", filter, mqttwire.TypeName(p.Type))
		}
		// A broker may send what matches before the SUBACK (MQTT 3.8.4):
		// this run publishes nothing before every subscription is in place,
		// so it is what an earlier run left in a durable group. It is
		// acknowledged and not counted.
		pub, err := mqttwire.DecodePublish(m.proto, p)
		if err != nil {
			return fmt.Errorf("before the SUBACK for %s: %w", filter, err)
		}
		var ack []byte
		switch pub.QoS {
		case 1:
			ack = mqttwire.AppendAck(nil, mqttwire.TypePuback, pub.PacketID, 0)
		case 2:
			ack = mqttwire.AppendAck(nil, mqttwire.TypePubrec, pub.PacketID, 0)
		}
		if ack != nil {
			if _, err := m.c.Write(ack); err != nil {
				return err
			}
		}
	}
	sa, err := mqttwire.DecodeSuback(m.proto, p)
	if err != nil {
		return err
	}
	if len(sa.ReasonCodes) != 1 || sa.ReasonCodes[0] >= 0x80 {
		return fmt.Errorf("subscription to %s refused: %x", filter, sa.ReasonCodes)
	}
	return nil
}

func (m *mconn) close() {
	m.c.Write(mqttwire.AppendDisconnect(nil, 0))
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
