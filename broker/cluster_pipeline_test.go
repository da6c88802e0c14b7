package broker

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// rawPublisher is an MQTT 5 publisher on a bare connection: it writes
// QoS 1 PUBLISH frames without waiting and reads the PUBACKs as they come,
// which no client library lets a test see in their order.
type rawPublisher struct {
	conn net.Conn
	r    *mqttwire.Reader
}

func dialRawPublisher(t *testing.T, b *Broker, id string) *rawPublisher {
	t.Helper()
	conn := mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil)
	t.Cleanup(func() { _ = conn.Close() })
	p := &rawPublisher{conn: conn, r: mqttwire.NewReader(conn, 0)}
	p.write(t, mqtttest.Connect5(id, nil, nil))
	f := p.next(t)
	ca, err := mqttwire.DecodeConnack(mqttwire.Version5, f)
	if err != nil || ca.ReasonCode != 0 {
		t.Fatalf("connect %s: %+v, %v", id, ca, err)
	}
	return p
}

func (p *rawPublisher) write(t *testing.T, frame []byte) {
	t.Helper()
	if _, err := p.conn.Write(frame); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func (p *rawPublisher) next(t *testing.T) mqttwire.Packet {
	t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	f, err := p.r.Next()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return f
}

func (p *rawPublisher) publish(t *testing.T, id uint16, topic string, payload []byte) {
	t.Helper()
	p.write(t, mqtttest.Frame(mqttwire.TypePublish, 1<<1, mqtttest.Str(topic), mqtttest.U16(id), mqtttest.Props(), payload))
}

// pipelined publishes n QoS 1 messages on topic with up to window in flight;
// payload(i) is message i's. It returns the PUBACK reason codes, checking
// that the PUBACKs come in the order of the publishes.
func (p *rawPublisher) pipelined(t *testing.T, topic string, n, window int, payload func(int) []byte) []byte {
	t.Helper()
	codes := make([]byte, 0, n)
	sent := 0
	for len(codes) < n {
		for sent < n && sent-len(codes) < window {
			p.publish(t, uint16(sent%60000+1), topic, payload(sent))
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
		if want := uint16(len(codes)%60000 + 1); a.PacketID != want {
			t.Fatalf("PUBACK %d for packet id %d, want packet id %d: acknowledgements out of publish order", len(codes), a.PacketID, want)
		}
		codes = append(codes, a.ReasonCode)
	}
	return codes
}

// expectInOrder reads want's messages from every subscriber, in order.
func expectInOrder(t *testing.T, want []string, subs map[string]*mqtttest.V5) {
	t.Helper()
	for name, s := range subs {
		for i, w := range want {
			if m := s.Next(t); string(m.Payload) != w {
				t.Fatalf("%s: message %d is %q, want %q (lost, reordered or a refused one delivered)", name, i, m.Payload, w)
			}
		}
		expectNone(t, s, name)
	}
}

// A publisher with many QoS 1 publishes in flight gets its PUBACKs in
// publish order; every message is stored and reaches subscribers on every
// node (the publisher's too) in publish order; the stores were in flight
// together; and a publish the stream refuses is answered 0x80, not
// acknowledged, and delivered nowhere, while those around it go on.
func TestClusterPipelinedQoS1Publishes(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 3, nc.URLs())
	subs := map[string]*mqtttest.V5{}
	for i, b := range bs {
		name := fmt.Sprintf("sub-%d", i)
		s := dialV5(t, b, &paho.Connect{ClientID: name, CleanStart: true, KeepAlive: 30})
		s.Subscribe(t, paho.SubscribeOptions{Topic: "pipe/#", QoS: 1})
		subs[name] = s
	}
	pub := dialRawPublisher(t, bs[0], "pipe-pub")

	const n, window = 600, 100
	codes := pub.pipelined(t, "pipe/a", n, window, func(i int) []byte { return fmt.Appendf(nil, "m%d", i) })
	want := make([]string, n)
	for i, c := range codes {
		if c != 0 {
			t.Fatalf("publish %d answered %#x", i, c)
		}
		want[i] = fmt.Sprintf("m%d", i)
	}
	if got := bs[0].ClusterNode().Stats.StoreWindowMax.Load(); got < 2 {
		t.Errorf("at most %d store of the publisher was in flight at once: not pipelined", got)
	}
	expectInOrder(t, want, subs)
	stored := streamMessages(t, nc.URLs()[0])

	// The stream now refuses messages over 200 bytes: every fourth publish
	// is larger. Those are refused with 0x80 in their place among the
	// acknowledgements, and delivered to nobody.
	setMaxMsgSize(t, nc.URLs()[0], 200)
	codes = pub.pipelined(t, "pipe/b", n, window, func(i int) []byte {
		if i%4 == 3 {
			return make([]byte, 400)
		}
		return fmt.Appendf(nil, "b%d", i)
	})
	want = want[:0]
	for i, c := range codes {
		switch {
		case i%4 == 3 && c != packetsUnspecified:
			t.Fatalf("publish %d, too large for the stream, answered %#x, want 0x80", i, c)
		case i%4 != 3 && c != 0:
			t.Fatalf("publish %d answered %#x", i, c)
		case i%4 != 3:
			want = append(want, fmt.Sprintf("b%d", i))
		}
	}
	expectInOrder(t, want, subs)
	if got := streamMessages(t, nc.URLs()[0]) - stored; got != uint64(len(want)) {
		t.Errorf("the stream took %d messages of the second round, want the %d acknowledged", got, len(want))
	}
}

const packetsUnspecified = 0x80

func jsClient(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	c, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	js, err := jetstream.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func streamMessages(t *testing.T, url string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := jsClient(t, url).Stream(ctx, cluster.StreamMessages)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func setMaxMsgSize(t *testing.T, url string, size int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := jsClient(t, url)
	st, err := js.Stream(ctx, cluster.StreamMessages)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = size
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}
