package mqtttest

import (
	"net"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// RawPublisher is an MQTT 5 publisher on a bare connection: it writes QoS 1
// PUBLISH frames without waiting and reads the PUBACKs as they come, in the
// order the broker sent them, which no client library lets a test see.
type RawPublisher struct {
	conn net.Conn
	r    *mqttwire.Reader
}

// DialRawPublisher connects a RawPublisher as clientID to addr (TCP). It is
// closed in t.Cleanup.
func DialRawPublisher(t testing.TB, addr, clientID string) *RawPublisher {
	t.Helper()
	conn := Dial(t, TCP, addr, nil)
	t.Cleanup(func() { _ = conn.Close() })
	p := &RawPublisher{conn: conn, r: mqttwire.NewReader(conn, 0)}
	p.write(t, Connect5(clientID, nil, nil))
	ca, err := mqttwire.DecodeConnack(mqttwire.Version5, p.next(t))
	if err != nil || ca.ReasonCode != 0 {
		t.Fatalf("connect %s: %+v, %v", clientID, ca, err)
	}
	return p
}

func (p *RawPublisher) write(t testing.TB, frame []byte) {
	t.Helper()
	if _, err := p.conn.Write(frame); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func (p *RawPublisher) next(t testing.TB) mqttwire.Packet {
	t.Helper()
	// A store may wait out a JetStream leader election (up to
	// cluster.DefaultPublishTimeout, 15 s) before its PUBACK.
	_ = p.conn.SetReadDeadline(time.Now().Add(max(Timeout, 30*time.Second)))
	f, err := p.r.Next()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return f
}

// Pipelined publishes n QoS 1 messages on topic with up to window in
// flight, payload(i) being message i's; before(i), when not nil, runs before
// message i is written. It returns the PUBACK reason codes, failing the test
// if the PUBACKs do not come in the order of the publishes.
func (p *RawPublisher) Pipelined(t testing.TB, topic string, n, window int, payload func(int) []byte, before func(int)) []byte {
	t.Helper()
	id := func(i int) uint16 { return uint16(i%60000 + 1) }
	codes := make([]byte, 0, n)
	sent := 0
	for len(codes) < n {
		for sent < n && sent-len(codes) < window {
			if before != nil {
				before(sent)
			}
			p.write(t, Frame(mqttwire.TypePublish, 1<<1, Str(topic), U16(id(sent)), Props(), payload(sent)))
			sent++
		}
		f := p.next(t)
		if f.Type != mqttwire.TypePuback {
			t.Fatalf("got packet type %d, want a PUBACK", f.Type)
		}
		a, err := mqttwire.DecodeAck(mqttwire.Version5, f)
		if err != nil {
			t.Fatal(err)
		}
		if a.PacketID != id(len(codes)) {
			t.Fatalf("PUBACK %d for packet id %d, want packet id %d: acknowledgements out of publish order", len(codes), a.PacketID, id(len(codes)))
		}
		codes = append(codes, a.ReasonCode)
	}
	return codes
}
