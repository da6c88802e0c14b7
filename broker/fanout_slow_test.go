package broker

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"weak"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestConflateKeepsTheNewestValuePerTopic: a reader that stops reading,
// under the conflate policy, gets the newest value of every topic when it
// reads again, each topic's values in order; what it did not get is counted.
func TestConflateKeepsTheNewestValuePerTopic(t *testing.T) {
	cfg := testConfig(t)
	cfg.ConnQueueOverrides = []ConnQueueOverride{{ClientPrefix: "dash-", SlowPolicy: connq.Conflate}}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	dash, _ := dialRaw(t, addr, "dash-1", rawOptions{version: 4, clean: true, rcvbuf: 4096})
	dash.subscribe("dash/#", 0)
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})

	// 20 sensors x 50 values x 8 KiB: 8 MB, far more than socket buffers
	// hold; conflated, the queue holds one value per sensor.
	const sensors, rounds = 20, 50
	pad := strings.Repeat("x", 8<<10)
	for r := range rounds {
		for s := range sensors {
			pub.Publish(t, &paho.Publish{Topic: fmt.Sprintf("dash/s%02d", s), QoS: 0, Payload: []byte(strconv.Itoa(r) + " " + pad)})
		}
	}
	pub.Publish(t, &paho.Publish{Topic: "dash/end", QoS: 1, Payload: []byte("end")}) // its PUBACK: all of the above routed

	v := clientView(t, b, "dash-1")
	if v.ConflatedMessages == 0 || v.DroppedMessages != 0 || v.SlowPolicy != "conflate" {
		t.Fatalf("client view %+v: want conflated messages, none dropped", v)
	}
	last := map[string]int{}
	received := 0
	for {
		m := dash.nextPublish()
		if m.TopicName == "dash/end" {
			break
		}
		r, _ := strconv.Atoi(strings.Fields(string(m.Payload))[0])
		if prev, ok := last[m.TopicName]; ok && r <= prev {
			t.Fatalf("%s: value %d after %d", m.TopicName, r, prev)
		}
		last[m.TopicName] = r
		received++
	}
	for s := range sensors {
		if topic := fmt.Sprintf("dash/s%02d", s); last[topic] != rounds-1 {
			t.Errorf("%s: last value %d, want the newest, %d", topic, last[topic], rounds-1)
		}
	}
	if uint64(received)+v.ConflatedMessages != sensors*rounds {
		t.Errorf("received %d + conflated %d = %d, want %d published", received, v.ConflatedMessages, uint64(received)+v.ConflatedMessages, sensors*rounds)
	}
	t.Logf("dashboard: received %d, conflated %d", received, v.ConflatedMessages)
	if got := b.connStats.Conflated.Load(); got != v.ConflatedMessages {
		t.Errorf("metrics count %d conflated, the client %d", got, v.ConflatedMessages)
	}
}

// TestDropSignalCountsWhatTheClientMissed: an MQTT 5 client that asks for
// the drop signal (CONNECT user property drop-signal=1) learns, on the first
// message after drops, how many it missed; the counts add up.
func TestDropSignalCountsWhatTheClientMissed(t *testing.T) {
	cfg := testConfig(t)
	cfg.ConnQueueOverrides = []ConnQueueOverride{{ClientPrefix: "sig-", SlowPolicy: connq.DropNewest, ConnQueueSoft: 64 << 10, ConnQueueHard: 64 << 10}}
	cfg.MaxPacketSize = 32 << 10
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	opts := rawOptions{version: 5, clean: true, rcvbuf: 4096, user: []packets.UserProperty{{Key: "drop-signal", Val: "1"}}}
	sig, _ := dialRaw(t, addr, "sig-1", opts)
	sig.subscribe("sig/data", 0)
	sig.subscribe("sig/end", 1)
	plain, _ := dialRaw(t, addr, "sig-2", rawOptions{version: 5, clean: true, rcvbuf: 4096})
	plain.subscribe("sig/data", 0)
	plain.subscribe("sig/end", 1)
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	const n = 300
	pad := strings.Repeat("y", 4<<10)
	for i := range n {
		pub.Publish(t, &paho.Publish{Topic: "sig/data", QoS: 0, Payload: []byte(strconv.Itoa(i) + " " + pad)})
	}
	pub.Publish(t, &paho.Publish{Topic: "sig/end", QoS: 1, Payload: []byte("end")})

	dropped := clientView(t, b, "sig-1").DroppedMessages
	if dropped == 0 {
		t.Fatal("nothing dropped: the test did not stall the reader")
	}
	received, signalled, signals := 0, 0, 0
	for {
		m := sig.nextPublish()
		if v, ok := userProperty(m, connq.DropSignalProperty); ok {
			k, err := strconv.Atoi(v)
			if err != nil || k <= 0 {
				t.Fatalf("drop signal %q", v)
			}
			signalled += k
			signals++
		}
		if m.TopicName == "sig/end" {
			sig.ack(m)
			break
		}
		received++
	}
	if uint64(signalled) != dropped || received+signalled != n {
		t.Fatalf("received %d, signals (%d) add up to %d, dropped %d: want received + signalled = %d and signalled = dropped",
			received, signals, signalled, dropped, n)
	}
	t.Logf("received %d, missed %d, told in %d signals", received, signalled, signals)
	for { // the client that did not ask is told nothing
		m := plain.nextPublish()
		if _, ok := userProperty(m, connq.DropSignalProperty); ok {
			t.Fatal("drop signal sent to a client that did not ask for it")
		}
		if m.TopicName == "sig/end" {
			break
		}
	}
}

// TestTopicAliasesOnTheFastPath: a paho MQTT 5 client that allows topic
// aliases gets them on QoS 0 (and QoS 1) deliveries: the first message of a
// topic carries the topic and its alias, later ones the alias alone, and
// topics past its Topic Alias Maximum go without.
func TestTopicAliasesOnTheFastPath(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	max := uint16(2)
	sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "aliased", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{TopicAliasMaximum: &max}})
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "al/#", QoS: 1})
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	topics := []string{"al/x", "al/y", "al/z", "al/x", "al/y", "al/z", "al/x"}
	for i, topic := range topics {
		pub.Publish(t, &paho.Publish{Topic: topic, QoS: byte(i % 2), Payload: []byte(strconv.Itoa(i))})
	}
	want := []struct {
		topic string
		alias uint16
	}{{"al/x", 1}, {"al/y", 2}, {"al/z", 0}, {"", 1}, {"", 2}, {"al/z", 0}, {"", 1}}
	aliases := map[uint16]string{}
	for i, w := range want {
		m := sub.Next(t)
		alias := uint16(0)
		if m.Properties != nil && m.Properties.TopicAlias != nil {
			alias = *m.Properties.TopicAlias
		}
		if m.Topic != w.topic || alias != w.alias || string(m.Payload) != strconv.Itoa(i) {
			t.Fatalf("message %d: topic %q alias %d payload %q, want %q alias %d", i, m.Topic, alias, m.Payload, w.topic, w.alias)
		}
		if m.Topic != "" && alias != 0 {
			aliases[alias] = m.Topic
		}
		if got := aliases[alias]; m.Topic == "" && got != topics[i] {
			t.Fatalf("message %d: alias %d stands for %q, want %q", i, alias, got, topics[i])
		}
	}
}

// TestClosedConnectionsAreNotKeptAlive: clients subscribe, take part in
// publishes (which fill the fan-out's route cache) and go away; once they
// are gone no mochi Client of theirs is reachable (issue 14: the route cache
// held *mqtt.Client pointers of closed connections).
func TestClosedConnectionsAreNotKeptAlive(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	const n = 20
	var gone []weak.Pointer[mqtt.Client]
	for i := range n {
		id := fmt.Sprintf("churn-%d", i)
		c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
		c.Subscribe(t, paho.SubscribeOptions{Topic: fmt.Sprintf("churn/%d/#", i), QoS: byte(i % 2)})
		c.Subscribe(t, paho.SubscribeOptions{Topic: "churn/all", QoS: 1})
		for _, topic := range []string{fmt.Sprintf("churn/%d/a", i), "churn/all"} {
			pub.Publish(t, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("x")})
			c.Next(t)
		}
		cl, ok := b.server.Clients.Get(id)
		if !ok {
			t.Fatalf("%s not known", id)
		}
		gone = append(gone, weak.Make(cl))
		c.Close()
		waitFor(t, mqtttest.Timeout, id+" to be forgotten", func() bool { _, ok := b.server.Clients.Get(id); return !ok })
	}
	// Later publishes to the topics (their cached routes stay) find nobody.
	pub.Publish(t, &paho.Publish{Topic: "churn/all", QoS: 1, Payload: []byte("y")})
	waitFor(t, mqtttest.Timeout, "their Clients to be collected", func() bool {
		runtime.GC()
		for _, w := range gone {
			if w.Value() != nil {
				return false
			}
		}
		return true
	})
}
