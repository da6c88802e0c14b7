package broker

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func TestFanoutDeliversEveryQoS0MessageInOrderToV3AndV5(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	const perKind, msgs = 4, 500
	var v5s []*mqtttest.V5
	var v3s []*mqtttest.V3
	for i := range perKind {
		s5 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: fmt.Sprintf("v5-%d", i), CleanStart: true, KeepAlive: 30})
		s5.Subscribe(t, paho.SubscribeOptions{Topic: "fan/t", QoS: 0})
		v5s = append(v5s, s5)
		s3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), fmt.Sprintf("v3-%d", i), true, nil)
		s3.Subscribe(t, "fan/+", 0)
		v3s = append(v3s, s3)
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for i := range msgs {
		pub.Publish(t, &paho.Publish{Topic: "fan/t", QoS: 0, Payload: []byte(strconv.Itoa(i))})
	}
	for i := range msgs {
		for j, s := range v5s {
			if m := s.Next(t); string(m.Payload) != strconv.Itoa(i) || m.QoS != 0 {
				t.Fatalf("v5-%d message %d = %q qos %d", j, i, m.Payload, m.QoS)
			}
		}
		for j, s := range v3s {
			if m := s.Next(t); string(m.Payload()) != strconv.Itoa(i) {
				t.Fatalf("v3-%d message %d = %q", j, i, m.Payload())
			}
		}
	}
	// The messages went through the encode-once path: 2 variants per publish.
	f := &b.fanout.Stats
	if d, e := f.Deliveries.Load(), f.Encodes.Load(); d != 2*perKind*msgs || e != 2*msgs {
		t.Errorf("fan-out deliveries %d, encodes %d; want %d and %d", d, e, 2*perKind*msgs, 2*msgs)
	}
}

func TestFanoutOverlapPropertiesRetainAndNoLocal(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "sub", CleanStart: true, KeepAlive: 30})
	id1, id2 := 1, 2
	for _, s := range []struct {
		opts paho.SubscribeOptions
		id   *int
	}{
		{paho.SubscribeOptions{Topic: "o/#", QoS: 0, RetainAsPublished: true}, &id1},
		{paho.SubscribeOptions{Topic: "o/+", QoS: 0, RetainAsPublished: true}, &id2}, // mochi merges overlapping subscriptions' flags unevenly
	} {
		ctx := t.Context()
		if _, err := sub.Client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{s.opts}, Properties: &paho.SubscribeProperties{SubscriptionIdentifier: s.id}}); err != nil {
			t.Fatal(err)
		}
	}
	v3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "v3", true, nil)
	v3.Subscribe(t, "o/#", 0)
	// sub publishes too, to a topic it follows with no-local.
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "mine/#", QoS: 0, NoLocal: true})

	expiry := uint32(600)
	props := &paho.PublishProperties{
		ContentType: "text/plain", ResponseTopic: "r/1", CorrelationData: []byte{9, 8},
		MessageExpiry: &expiry, User: paho.UserProperties{{Key: "key", Value: "k1"}, {Key: "key", Value: "k2"}},
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "o/x", QoS: 0, Retain: true, Payload: []byte("one"), Properties: props})
	sub.Publish(t, &paho.Publish{Topic: "mine/x", QoS: 0, Payload: []byte("own")})
	pub.Publish(t, &paho.Publish{Topic: "mine/x", QoS: 0, Payload: []byte("theirs")})
	pub.Publish(t, &paho.Publish{Topic: "o/end", QoS: 0, Payload: []byte("sentinel")})

	m := sub.Next(t)
	if string(m.Payload) != "one" || !m.Retain {
		t.Fatalf("first message %q retain=%v, want \"one\" with retain kept (retain-as-published)", m.Payload, m.Retain)
	}
	p := m.Properties
	if p.ContentType != "text/plain" || p.ResponseTopic != "r/1" || string(p.CorrelationData) != "\x09\x08" ||
		fmt.Sprint(p.User) != fmt.Sprint(props.User) || p.MessageExpiry == nil || *p.MessageExpiry == 0 || *p.MessageExpiry > 600 ||
		p.SubscriptionIdentifier == nil {
		t.Errorf("properties = %+v (expiry %v, sub id %v)", p, p.MessageExpiry, p.SubscriptionIdentifier)
	}
	// Overlapping subscriptions: one copy, then the other messages in order.
	if m := sub.Next(t); string(m.Payload) != "theirs" {
		t.Fatalf("second message %q, want \"theirs\" (one copy of \"one\"; own message held back by no-local)", m.Payload)
	}
	if m := sub.Next(t); string(m.Payload) != "sentinel" {
		t.Fatalf("third message %q, want the sentinel", m.Payload)
	}
	if m := v3.Next(t); string(m.Payload()) != "one" || m.Retained() {
		t.Errorf("MQTT 3.1.1 subscriber got %q retained=%v, want \"one\" without the retain flag", m.Payload(), m.Retained())
	}
}

// rawSubscribe connects an MQTT 3.1.1 client by hand and subscribes it; the
// test then decides when (and whether) it reads.
func rawSubscribe(t *testing.T, addr, clientID, filter string, qos byte) net.Conn {
	t.Helper()
	c := rawConnect(t, addr, clientID)
	body := binary.BigEndian.AppendUint16(nil, 1)
	body = mqtttest.AppendString(body, filter)
	body = append(body, qos)
	if _, err := c.Write(append(mqtttest.AppendVarint([]byte{0x82}, len(body)), body...)); err != nil {
		t.Fatal(err)
	}
	ack := make([]byte, 5)
	if _, err := io.ReadFull(c, ack); err != nil || ack[0] != 0x90 || ack[4] != qos {
		t.Fatalf("SUBACK %x: %v", ack, err)
	}
	return c
}

// readPublish reads up to the next PUBLISH frame and returns its payload.
func readPublish(r *bufio.Reader) ([]byte, error) {
	p, _, err := readAnyPublish(r)
	return p, err
}

// readAnyPublish reads frames until a PUBLISH and returns its payload and
// QoS (packets of other types are skipped).
func readAnyPublish(r *bufio.Reader) ([]byte, byte, error) {
	for {
		h, err := r.ReadByte()
		if err != nil {
			return nil, 0, err
		}
		n, mult := 0, 1
		for {
			d, err := r.ReadByte()
			if err != nil {
				return nil, 0, err
			}
			n += int(d&0x7f) * mult
			mult *= 128
			if d&0x80 == 0 {
				break
			}
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, 0, err
		}
		if h>>4 != 3 {
			continue
		}
		qos := (h >> 1) & 3
		off := 2 + int(binary.BigEndian.Uint16(body))
		if qos > 0 {
			off += 2
		}
		return body[off:], qos, nil
	}
}

func clientView(t *testing.T, b *Broker, id string) adminapi.ClientView {
	t.Helper()
	code, body := httpGet(t, "http://"+b.Addr("http")+"/api/v1/clients/"+id)
	if code != 200 {
		t.Fatalf("GET /api/v1/clients/%s = %d %s", id, code, body)
	}
	var v adminapi.ClientView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSlowReadersFollowTheirPolicyAndHurtNobody(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxPacketSize = 128 << 10
	small := ByteSize(256 << 10)
	cfg.ConnQueueOverrides = []ConnQueueOverride{
		{ClientPrefix: "fast-", ConnQueueSoft: 64 << 20, ConnQueueHard: 64 << 20},
		{ClientPrefix: "slow-drop-", SlowPolicy: connq.DropOldest, ConnQueueSoft: small, ConnQueueHard: small},
		{ClientPrefix: "slow-cut-", SlowPolicy: connq.Disconnect, ConnQueueSoft: small, ConnQueueHard: small},
		{ClientPrefix: "slow-q1-", ConnQueueSoft: small, ConnQueueHard: small},
	}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")

	fast := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "fast-1", CleanStart: true, KeepAlive: 30})
	fast.Subscribe(t, paho.SubscribeOptions{Topic: "big/#", QoS: 0})
	dropper := rawSubscribe(t, addr, "slow-drop-1", "big/#", 0)
	cutter := rawSubscribe(t, addr, "slow-cut-1", "big/#", 0)
	q1 := rawSubscribe(t, addr, "slow-q1-1", "big/#", 1)

	// 400 x 64 KiB = 25 MiB: far more than the stalled readers' socket
	// buffers and queues hold.
	//
	// The publisher runs on its own; the test follows the reading
	// subscriber, one message at a time. A publisher held up by the stalled
	// readers shows as that subscriber getting nothing more: each wait
	// covers one message's fan-out. (Waiting for each QoS 1 publish's
	// PUBACK within mqtttest.Timeout, as this test did, covered the fan-out
	// of every QoS 0 publish still in the socket buffers before it, up to
	// 49 x 64 KiB, and that wait measures how much CPU the process gets: it
	// took 2-7 s on the shared machine and failed past 10 s under load.)
	const n = 400
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	published := make(chan error, 1)
	go func() {
		payload := make([]byte, 64<<10)
		for i := range n {
			copy(payload, fmt.Sprintf("%06d", i))
			qos := byte(0)
			if i%50 == 49 {
				qos = 1 // the QoS 1 messages must be acknowledged: the publisher is never held up
			}
			if r, err := pub.Client.Publish(ctx, &paho.Publish{Topic: "big/data", QoS: qos, Payload: payload}); err != nil || (r != nil && r.ReasonCode != 0) {
				published <- fmt.Errorf("publish %d: %v %+v", i, err, r)
				return
			}
		}
		// A QoS 1 sentinel: its PUBACK means every earlier publish has been fanned out.
		_, err := pub.Client.Publish(ctx, &paho.Publish{Topic: "big/end", QoS: 1, Payload: []byte("end")})
		published <- err
	}()

	// The reading subscriber got everything, in order.
	pubDone := published // nil once the publisher finished without an error
	next := func() *paho.Publish {
		t.Helper()
		for {
			select {
			case m := <-fast.Msgs:
				return m
			case err := <-pubDone:
				if err != nil {
					t.Fatalf("the publisher stopped before the subscriber got everything: %v", err)
				}
				pubDone = nil
			case <-time.After(mqtttest.Timeout):
				t.Fatalf("fast subscriber: no message within %v: the publisher is held up", mqtttest.Timeout)
			}
		}
	}
	for i := range n {
		if m := next(); string(m.Payload[:6]) != fmt.Sprintf("%06d", i) {
			t.Fatalf("fast subscriber message %d = %q", i, m.Payload[:6])
		}
	}
	if m := next(); string(m.Payload) != "end" {
		t.Fatalf("fast subscriber last message %q", m.Payload)
	}
	// The sentinel has been fanned out: its PUBACK is on its way.
	if pubDone != nil {
		select {
		case err := <-pubDone:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(mqtttest.Timeout):
			t.Fatal("the publisher got no PUBACK for a message every subscriber was sent")
		}
	}

	t.Run("disconnect cuts the client", func(t *testing.T) {
		if !mqtttest.IsClosed(cutter) {
			t.Fatal("slow-cut-1 still connected")
		}
	})
	t.Run("QoS 1 messages wait in the session, none lost, the client stays", func(t *testing.T) {
		if v := clientView(t, b, "slow-q1-1"); !v.Connected || v.QueuedBytes > int(small) {
			t.Fatalf("client view %+v: want connected, its queue within the soft limit", v)
		}
		r := bufio.NewReader(q1)
		_ = q1.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
		var qos1 []string
		for {
			p, qos, err := readAnyPublish(r)
			if err != nil {
				t.Fatalf("after %v: %v", qos1, err)
			}
			if qos == 1 {
				qos1 = append(qos1, string(p[:min(6, len(p))]))
			}
			if string(p) == "end" {
				break
			}
		}
		want := []string{}
		for i := 49; i < n; i += 50 {
			want = append(want, fmt.Sprintf("%06d", i))
		}
		if fmt.Sprint(qos1) != fmt.Sprint(append(want, "end")) {
			t.Fatalf("QoS 1 messages %v, want %v in order", qos1, append(want, "end"))
		}
	})
	if got := b.connStats.SlowDisconnects.Load(); got != 1 {
		t.Errorf("slow disconnects = %d, want 1", got)
	}

	t.Run("drop-oldest keeps the newest and counts the rest", func(t *testing.T) {
		v := clientView(t, b, "slow-drop-1")
		if v.DroppedMessages == 0 || v.SlowPolicy != "drop-oldest" || v.QueueHard != int(small) {
			t.Fatalf("client view %+v: want drops under drop-oldest with a 256KiB hard limit", v)
		}
		// Now read: what arrives is in order, ends with the newest message,
		// and with what was dropped adds up to what was published.
		r := bufio.NewReader(dropper)
		_ = dropper.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
		received, last := 0, -1
		for {
			p, err := readPublish(r)
			if err != nil {
				t.Fatalf("after %d messages: %v", received, err)
			}
			if string(p) == "end" {
				break
			}
			seq, _ := strconv.Atoi(string(p[:6]))
			if seq <= last {
				t.Fatalf("message %d after %d: out of order", seq, last)
			}
			last = seq
			received++
		}
		if last != n-1 {
			t.Errorf("last message before the sentinel is %d, want the newest, %d", last, n-1)
		}
		if uint64(received)+v.DroppedMessages != n {
			t.Errorf("received %d + dropped %d = %d, want %d published", received, v.DroppedMessages, uint64(received)+v.DroppedMessages, n)
		}
		t.Logf("slow reader: received %d, dropped %d (%d bytes)", received, v.DroppedMessages, v.DroppedBytes)
	})
}

// TestFanoutRoutesFollowSubscriptionChanges drives the cached fast path
// through subscribe, unsubscribe, a resumed session and a QoS 1 subscriber.
func TestFanoutRoutesFollowSubscriptionChanges(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	send := func(payload string, qos byte) {
		t.Helper()
		if rc := pub.Publish(t, &paho.Publish{Topic: "r/t", QoS: qos, Payload: []byte(payload)}); rc >= 0x80 {
			t.Fatalf("publish %s: %#x", payload, rc)
		}
	}
	expect := func(c *mqtttest.V5, want string) {
		t.Helper()
		if m := c.Next(t); string(m.Payload) != want {
			t.Fatalf("%s got %q, want %q", c.ClientID(), m.Payload, want)
		}
	}

	a := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "a", CleanStart: true, KeepAlive: 30})
	a.Subscribe(t, paho.SubscribeOptions{Topic: "r/#", QoS: 0})
	send("1", 0) // builds the cached routes: a
	expect(a, "1")

	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "c", CleanStart: true, KeepAlive: 30})
	c.Subscribe(t, paho.SubscribeOptions{Topic: "r/t", QoS: 0})
	send("2", 0) // a new subscriber is seen at once
	expect(a, "2")
	expect(c, "2")

	if _, err := a.Client.Unsubscribe(t.Context(), &paho.Unsubscribe{Topics: []string{"r/#"}}); err != nil {
		t.Fatal(err)
	}
	send("3", 0) // an unsubscribed one gets nothing more
	expect(c, "3")

	// A persistent session goes away and resumes on a new connection.
	expiry := uint32(60)
	pcon := &paho.Connect{ClientID: "p", CleanStart: false, KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}
	p1, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), pcon)
	if err != nil {
		t.Fatal(err)
	}
	p1.Subscribe(t, paho.SubscribeOptions{Topic: "r/t", QoS: 0})
	send("4", 0)
	expect(p1, "4")
	expect(c, "4")
	p1.Close()
	send("5", 0) // QoS 0 for an offline session is dropped, as MQTT allows
	expect(c, "5")
	p2 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), pcon)
	send("6", 0)
	// "5" may reach the resumed session after all: the publisher's goroutine
	// delivers to c first and may be descheduled before p's route while p
	// resumes (seen once on a loaded machine). MQTT lets a broker drop QoS 0
	// for a session that is away; it does not require it.
	if m := p2.Next(t); string(m.Payload) == "5" {
		expect(p2, "6")
	} else if string(m.Payload) != "6" {
		t.Fatalf("p got %q, want \"6\" (or \"5\" then \"6\")", m.Payload)
	}
	expect(c, "6")

	// A QoS 1 subscriber sends QoS 1 publishes mochi's way; both still get them.
	q := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "q", CleanStart: true, KeepAlive: 30})
	q.Subscribe(t, paho.SubscribeOptions{Topic: "r/t", QoS: 1})
	send("7", 1)
	expect(c, "7")
	expect(p2, "7")
	if m := q.Next(t); string(m.Payload) != "7" || m.QoS != 1 {
		t.Fatalf("QoS 1 subscriber got %q at QoS %d", m.Payload, m.QoS)
	}
	send("8", 0) // QoS 0 publishes stay on the fast path with a QoS 1 subscriber
	for _, s := range []*mqtttest.V5{c, p2, q} {
		expect(s, "8")
	}
	if b.fanout.Stats.FastPath.Load() == 0 {
		t.Error("no publish took the fast path")
	}
}
