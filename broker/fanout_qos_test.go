package broker

import (
	"strconv"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func publishN(t *testing.T, pub *mqtttest.V5, topic string, qos byte, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if rc := pub.Publish(t, &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(strconv.Itoa(i))}); rc >= 0x80 {
			t.Fatalf("publish %d: reason %#x", i, rc)
		}
	}
}

// TestQoS1FastPathIDsWindowAndResendOrder: QoS 1 deliveries come with
// distinct packet ids, at most Receive Maximum unacknowledged; after a
// reconnect the unacknowledged ones come again first, in their original
// order, with DUP set and their ids, then the rest.
func TestQoS1FastPathIDsWindowAndResendOrder(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	opts := rawOptions{version: 5, clean: true, sessionExpiry: 300, receiveMax: 5}
	sub, _ := dialRaw(t, addr, "sub", opts)
	sub.subscribe("q/#", 1)
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	const n = 30
	publishN(t, pub, "q/a", 1, 0, n) // every PUBACK is back: all are queued

	if held, inflight, _ := b.fanout.Outbox("sub", 0); held != n || inflight != 5 {
		t.Fatalf("outbox holds %d with %d in flight, want %d and the Receive Maximum, 5", held, inflight, n)
	}
	ids := map[int]uint16{}
	got := func(c *rawClient, want int, dup bool) packets.Packet {
		t.Helper()
		m := c.nextPublish()
		seq, _ := strconv.Atoi(string(m.Payload))
		switch {
		case seq != want:
			t.Fatalf("message %d, want %d", seq, want)
		case m.FixedHeader.Qos != 1 || m.FixedHeader.Dup != dup || m.PacketID == 0:
			t.Fatalf("message %d: qos %d dup %v id %d, want qos 1 dup %v", seq, m.FixedHeader.Qos, m.FixedHeader.Dup, m.PacketID, dup)
		case dup && ids[seq] != m.PacketID:
			t.Fatalf("message %d resent with id %d, first sent with %d", seq, m.PacketID, ids[seq])
		}
		ids[seq] = m.PacketID
		return m
	}
	var window []packets.Packet
	for i := range 5 {
		window = append(window, got(sub, i, false))
	}
	seen := map[uint16]bool{}
	for _, m := range window {
		if seen[m.PacketID] {
			t.Fatalf("packet id %d twice in one window", m.PacketID)
		}
		seen[m.PacketID] = true
	}
	sub.ack(window[0])
	sub.ack(window[1])
	got(sub, 5, false)
	got(sub, 6, false)

	// The connection breaks; the session resumes on a new one.
	sub.c.Close()
	opts.clean = false
	sub2, ack := dialRaw(t, addr, "sub", opts)
	if !ack.SessionPresent {
		t.Fatal("session not present")
	}
	for i := 2; i <= 6; i++ {
		got(sub2, i, true)
	}
	for i := 2; i <= 6; i++ {
		sub2.ack(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, PacketID: ids[i]})
	}
	for i := 7; i < n; i++ {
		sub2.ack(got(sub2, i, false))
	}
	waitFor(t, mqtttest.Timeout, "the outbox to empty", func() bool { held, _, _ := b.fanout.Outbox("sub", 0); return held == 0 })
}

// TestQoS2FastPathResendsPUBRELAfterPUBREC: a QoS 2 delivery whose PUBREC
// arrived gets its PUBREL again after a reconnect, not the PUBLISH; one
// without gets the PUBLISH with DUP.
func TestQoS2FastPathResendsPUBRELAfterPUBREC(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	opts := rawOptions{version: 5, clean: true, sessionExpiry: 300}
	sub, _ := dialRaw(t, addr, "sub2", opts)
	sub.subscribe("q2/#", 2)
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	publishN(t, pub, "q2/x", 2, 0, 3)
	first, second := sub.nextPublish(), sub.nextPublish()
	third := sub.nextPublish()
	if first.FixedHeader.Qos != 2 || string(first.Payload) != "0" || string(third.Payload) != "2" {
		t.Fatalf("got %q qos %d", first.Payload, first.FixedHeader.Qos)
	}
	sub.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: first.PacketID})
	if rel := sub.next(); rel.FixedHeader.Type != packets.Pubrel || rel.PacketID != first.PacketID {
		t.Fatalf("after PUBREC: %v %d", rel.FixedHeader.Type, rel.PacketID)
	}
	sub.ack(third) // completes the third: it is not resent
	waitFor(t, mqtttest.Timeout, "the third's PUBCOMP", func() bool { held, _, _ := b.fanout.Outbox("sub2", 0); return held == 2 })
	sub.c.Close()

	opts.clean = false
	sub2, _ := dialRaw(t, addr, "sub2", opts)
	rel := sub2.next()
	if rel.FixedHeader.Type != packets.Pubrel || rel.PacketID != first.PacketID {
		t.Fatalf("first after reconnect: %v id %d, want PUBREL %d", rel.FixedHeader.Type, rel.PacketID, first.PacketID)
	}
	sub2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubcomp}, PacketID: first.PacketID})
	m := sub2.nextPublish()
	if string(m.Payload) != "1" || !m.FixedHeader.Dup || m.PacketID != second.PacketID {
		t.Fatalf("second after reconnect: %q dup %v id %d, want \"1\" again with DUP and id %d", m.Payload, m.FixedHeader.Dup, m.PacketID, second.PacketID)
	}
	sub2.ack(m)
	waitFor(t, mqtttest.Timeout, "the outbox to empty", func() bool { held, _, _ := b.fanout.Outbox("sub2", 0); return held == 0 })
}

// TestQueuedMessagesKeepTheirOrder: a persistent session (MQTT 3.1.1 clean
// session false, MQTT 5 session expiry) gets the messages queued while it was
// away in publish order, 1,500 of them published as fast as one publisher can.
func TestQueuedMessagesKeepTheirOrder(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	const n = 1500
	url := mqtttest.V3URL(mqtttest.TCP, addr)
	mqtttest.AwayV3(t, url, "away-v3", "ord/#")
	expiry := uint32(300)
	v5c := &paho.Connect{ClientID: "away-v5", CleanStart: false, KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}
	v5 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), v5c)
	v5.Subscribe(t, paho.SubscribeOptions{Topic: "ord/#", QoS: 1})
	v5.Close()

	// One publisher, QoS 1, every publish in flight at once (paho's async API).
	pub := mqtttest.ConnectV3(t, url, "fast-pub", true, nil)
	t.Logf("%d QoS 1 messages queued in %v", n, pub.PublishSeq(t, "ord/t", 1, n))

	v3 := mqtttest.ConnectV3(t, url, "away-v3", false, nil)
	for i := range n {
		if m := v3.Next(t); string(m.Payload()) != strconv.Itoa(i) {
			t.Fatalf("MQTT 3.1.1 session: message %d is %q", i, m.Payload())
		}
	}
	v5 = mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), v5c)
	for i := range n {
		if m := v5.Next(t); string(m.Payload) != strconv.Itoa(i) {
			t.Fatalf("MQTT 5 session: message %d is %q", i, m.Payload)
		}
	}
}
