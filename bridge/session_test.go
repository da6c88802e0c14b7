package bridge

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
	"github.com/keyline-mq/keyline/internal/poll"
	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Protocol corners against a scripted remote: a fake broker on loopback
// that reads the bridge's frames and answers as each test says.

// fakeRemote accepts connections; each one goes to the test through conns.
type fakeRemote struct {
	ln    net.Listener
	conns chan *remoteConn
}

type remoteConn struct {
	net.Conn
	r *mqttwire.Reader
}

func newFakeRemote(t *testing.T) *fakeRemote {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRemote{ln: ln, conns: make(chan *remoteConn, 8)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.conns <- &remoteConn{Conn: c, r: mqttwire.NewReader(c, 4096)}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for {
			select {
			case c := <-f.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return f
}

// accept returns the next connection and its CONNECT frame.
func (f *fakeRemote) accept(t *testing.T) (*remoteConn, mqttwire.Packet) {
	t.Helper()
	select {
	case c := <-f.conns:
		t.Cleanup(func() { c.Close() })
		return c, c.next(t)
	case <-time.After(mqtttest.Timeout):
		t.Fatal("the bridge did not connect")
		return nil, mqttwire.Packet{}
	}
}

func (c *remoteConn) next(t *testing.T) mqttwire.Packet {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	p, err := c.r.Next()
	if err != nil {
		t.Fatalf("remote: reading the bridge: %v", err)
	}
	p.Body = append([]byte(nil), p.Body...)
	return p
}

// nextOf skips PINGREQs.
func (c *remoteConn) nextOf(t *testing.T, typ byte) mqttwire.Packet {
	t.Helper()
	for {
		p := c.next(t)
		if p.Type == mqttwire.TypePingreq {
			continue
		}
		if p.Type != typ {
			t.Fatalf("remote: got %s, want %s", mqttwire.TypeName(p.Type), mqttwire.TypeName(typ))
		}
		return p
	}
}

func (c *remoteConn) send(t *testing.T, frame []byte) {
	t.Helper()
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
}

// connack5 is an MQTT 5 CONNACK.
func connack5(sessionPresent bool) []byte {
	var flags byte
	if sessionPresent {
		flags = 1
	}
	return mqtttest.Frame(mqttwire.TypeConnack, 0, []byte{flags, 0}, mqtttest.Props())
}

// fakeGroup records what the bridge tells its group.
type fakeGroup struct {
	name string
	mu   sync.Mutex
	log  []string
	ch   chan string
}

func newFakeGroup(name string) *fakeGroup { return &fakeGroup{name: name, ch: make(chan string, 100)} }

func (g *fakeGroup) record(s string) {
	g.mu.Lock()
	g.log = append(g.log, s)
	g.mu.Unlock()
	g.ch <- s
}

// expect waits for the next event.
func (g *fakeGroup) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-g.ch:
		if got != want {
			t.Fatalf("group: %s, want %s", got, want)
		}
	case <-time.After(mqtttest.Timeout):
		t.Fatalf("group: no %s", want)
	}
}

func (g *fakeGroup) Name() string                             { return g.name }
func (g *fakeGroup) AddMember(string, int) error              { g.record("add"); return nil }
func (g *fakeGroup) RemoveMember(string) error                { g.record("remove"); return nil }
func (g *fakeGroup) Ack(_ string, off uint64)                 { g.record("ack " + itoa(off)) }
func (g *fakeGroup) Nack(_ string, off uint64, reason byte)   { g.record("nack " + itoa(off)) }
func (g *fakeGroup) Reject(_ string, off uint64, reason byte) { g.record("reject " + itoa(off)) }
func (g *fakeGroup) Stats() (keyshared.Stats, keyshared.RouterStats) {
	return keyshared.Stats{}, keyshared.RouterStats{}
}
func (g *fakeGroup) Info() (persistence.GroupInfo, error) { return persistence.GroupInfo{}, nil }
func (g *fakeGroup) Holder() (string, bool)               { return "", false }
func (g *fakeGroup) HeldHere() bool                       { return true }
func (g *fakeGroup) Close()                               {}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

type fakeLocal struct {
	g *fakeGroup
}

func (l *fakeLocal) OpenGroup(share.Name, keyshared.Deliverer) (Group, error) { return l.g, nil }
func (l *fakeLocal) NewInjector(string, func(string) bool) Injector           { return nopInjector{} }

type nopInjector struct{}

func (nopInjector) Publish(*keyshared.Message, bool) error { return nil }
func (nopInjector) Close()                                 {}

// runBridge runs one bridge to remote until the test ends.
func runBridge(t *testing.T, remote *fakeRemote, mod func(*Config)) (*Bridge, *fakeGroup) {
	t.Helper()
	c := DefaultConfig()
	c.Name, c.Addresses, c.ClientID, c.Protocol = "b", []string{remote.ln.Addr().String()}, "edge", MQTT5
	c.ReconnectMin, c.ReconnectMax = 10*time.Millisecond, 50*time.Millisecond
	c.Rules = []Rule{{Pattern: "t/#", Direction: Out, QoS: 2}}
	if mod != nil {
		mod(&c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := NewManager([]Config{c}, Options{BrokerID: "here", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	g := newFakeGroup("g")
	if err := m.Start(&fakeLocal{g: g}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
		defer cancel()
		if err := m.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	return m.bridges[0], g
}

// deliver hands the bridge a message as its group's dispatcher would,
// retrying while the session is not yet attached.
func deliver(t *testing.T, b *Bridge, off uint64, qos byte) {
	t.Helper()
	m := &keyshared.Message{Offset: off, Key: "t/1", Topic: "t/1", QoS: qos, Payload: []byte("x")}
	poll.Until(t, mqtttest.Timeout, "the bridge to take the delivery", func() bool { return b.outs[0].Deliver(b.member, m, 1) })
}

func TestQoS2InFlightIsReleasedOnAResumedSession(t *testing.T) {
	remote := newFakeRemote(t)
	b, g := runBridge(t, remote, nil)
	c, _ := remote.accept(t)
	c.send(t, connack5(false))
	g.expect(t, "add")
	deliver(t, b, 1, 2)
	pub := c.nextOf(t, mqttwire.TypePublish)
	pv, err := mqttwire.DecodePublish(mqttwire.Version5, pub)
	if err != nil || pv.QoS != 2 {
		t.Fatalf("publish %+v %v", pv, err)
	}
	c.send(t, mqttwire.AppendAck(nil, mqttwire.TypePubrec, pv.PacketID, 0))
	if a, _ := mqttwire.DecodeAck(mqttwire.Version5, c.nextOf(t, mqttwire.TypePubrel)); a.PacketID != pv.PacketID {
		t.Fatalf("PUBREL for %d, want %d", a.PacketID, pv.PacketID)
	}
	c.Close() // before PUBCOMP: the remote holds the id as received
	g.expect(t, "remove")

	c2, _ := remote.accept(t)
	c2.send(t, connack5(true))
	rel := c2.nextOf(t, mqttwire.TypePubrel)
	if a, _ := mqttwire.DecodeAck(mqttwire.Version5, rel); a.PacketID != pv.PacketID {
		t.Fatalf("first packet on the resumed session: PUBREL %d, want %d", a.PacketID, pv.PacketID)
	}
	g.expect(t, "add")
	c2.send(t, mqttwire.AppendAck(nil, mqttwire.TypePubcomp, pv.PacketID, 0))
	// The id is free again, and the requeued message goes out afresh.
	deliver(t, b, 1, 2)
	pv2, _ := mqttwire.DecodePublish(mqttwire.Version5, c2.nextOf(t, mqttwire.TypePublish))
	c2.send(t, mqttwire.AppendAck(nil, mqttwire.TypePubrec, pv2.PacketID, 0))
	c2.nextOf(t, mqttwire.TypePubrel)
	c2.send(t, mqttwire.AppendAck(nil, mqttwire.TypePubcomp, pv2.PacketID, 0))
	g.expect(t, "ack 1")
}

func TestUnacknowledgedPublishEndsTheConnection(t *testing.T) {
	remote := newFakeRemote(t)
	b, g := runBridge(t, remote, func(c *Config) { c.AckTimeout = 100 * time.Millisecond })
	c, _ := remote.accept(t)
	c.send(t, connack5(false))
	g.expect(t, "add")
	deliver(t, b, 1, 1)
	c.nextOf(t, mqttwire.TypePublish) // and no PUBACK
	d := c.nextOf(t, mqttwire.TypeDisconnect)
	if dv, _ := mqttwire.DecodeDisconnect(mqttwire.Version5, d); dv.ReasonCode != 0x80 {
		t.Fatalf("DISCONNECT %#x, want 0x80 (a client may not send 0x8d)", dv.ReasonCode)
	}
	g.expect(t, "remove") // the dispatcher requeues it
	c2, _ := remote.accept(t)
	c2.send(t, connack5(false))
	g.expect(t, "add")
	if st := b.Status(); st.LastError == "" || st.Connects != 2 {
		t.Fatalf("status %+v: want the ack timeout as last error, two connections", st)
	}
}

func TestRefusedBridgeMarkIsDroppedFor311(t *testing.T) {
	remote := newFakeRemote(t)
	b, _ := runBridge(t, remote, func(c *Config) { c.Protocol = MQTT311 })
	c, connect := remote.accept(t)
	if level := connect.Body[6]; level != 0x84 {
		t.Fatalf("first CONNECT protocol level %#x, want 0x84 (try_private)", level)
	}
	c.Close() // as a broker that does not know the mark
	c2, connect2 := remote.accept(t)
	if level := connect2.Body[6]; level != 4 {
		t.Fatalf("second CONNECT protocol level %#x, want 4", level)
	}
	c2.send(t, mqtttest.Frame(mqttwire.TypeConnack, 0, []byte{0, 0}))
	if !poll.Within(mqtttest.Timeout, func() bool { return b.Status().State == "connected" }) {
		t.Fatalf("not connected over 3.1.1 without the mark: %+v", b.Status())
	}
	c2.Close()
	c3, connect3 := remote.accept(t)
	defer c3.Close()
	if level := connect3.Body[6]; level != 4 {
		t.Fatalf("a reconnection tried the mark again: protocol level %#x", level)
	}
}
