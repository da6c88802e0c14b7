package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// retainedThroughOutbox: retained QoS 1 messages sent on SUBSCRIBE take
// the session's outbox like every other delivery. With Receive Maximum 1
// only one is in flight; unacknowledged ones come again after a reconnect,
// first, with DUP and their packet ids, in the order they were sent; the
// RETAIN flag stays set [MQTT-3.3.1-9]. (mochi sent them itself, beside the
// outbox: past Receive Maximum, and resent by creation second.)
func retainedThroughOutbox(t *testing.T, pubNode, subNode *Broker) {
	pub, err := mqtttest.DialWorker(pubNode.Addr("tcp"), "ret-pub", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// mochi writes a QoS 1 PUBACK before it routes the message, so the
	// subscription below could still take ret/4 live (RETAIN clear) after
	// its PUBACK. A probe on the subscriber's node sees a last publish of
	// the same publisher only after every earlier one was routed there.
	probe, err := mqtttest.DialWorker(subNode.Addr("tcp"), "ret-probe", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if code, err := probe.Subscribe("ret-barrier", 1); err != nil || code != 1 {
		t.Fatalf("SUBACK %#x %v", code, err)
	}
	const n = 5
	for i := range n {
		if _, err := pub.PublishMessage(mqtttest.Outgoing{Topic: fmt.Sprintf("ret/%d", i), Payload: []byte(fmt.Sprint(i)), QoS: 1, Retain: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Publish("ret-barrier", []byte("routed"), 1); err != nil {
		t.Fatal(err)
	}
	if m := probe.Next(mqtttest.Timeout); m == nil || string(m.Payload) != "routed" {
		t.Fatalf("barrier: %+v", m)
	}
	opts := mqtttest.WorkerOptions{ReceiveMaximum: 1, SessionExpiry: 600, CleanStart: true}
	sub, err := mqtttest.DialWorker(subNode.Addr("tcp"), "ret-sub", opts)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := sub.Subscribe("ret/#", 1); err != nil || code != 1 {
		t.Fatalf("SUBACK %#x %v", code, err)
	}
	first := sub.Next(mqtttest.Timeout)
	if first == nil || !first.Retain || first.QoS != 1 {
		t.Fatalf("first retained message: %+v", first)
	}
	if m := sub.Next(300 * time.Millisecond); m != nil {
		t.Fatalf("a second message %q in flight past Receive Maximum 1", m.Payload)
	}
	sub.Vanish() // without acknowledging
	opts.CleanStart = false
	sub, err = mqtttest.DialWorker(subNode.Addr("tcp"), "ret-sub", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	seen := map[string]bool{}
	for i := range n {
		m := sub.Next(mqtttest.Timeout)
		if m == nil {
			t.Fatalf("message %d of %d missing after the reconnect", i+1, n)
		}
		if i == 0 && (!m.Dup || m.PacketID != first.PacketID || string(m.Payload) != string(first.Payload)) {
			t.Fatalf("resent %+v, want message %q again with DUP and id %d", m, first.Payload, first.PacketID)
		}
		if !m.Retain || seen[string(m.Payload)] {
			t.Fatalf("message %d: %+v (retain flag, or a duplicate)", i, m)
		}
		seen[string(m.Payload)] = true
		if err := sub.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRetainedOnSubscribeThroughOutbox(t *testing.T) {
	b := startBroker(t, testConfig(t))
	retainedThroughOutbox(t, b, b)
}

func TestClusterRetainedOnSubscribeThroughOutbox(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 2, nc.URLs())
	retainedThroughOutbox(t, bs[0], bs[1])
}
