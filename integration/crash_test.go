package integration

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestSigkillKeepsSessionsAndRetained kills the broker with SIGKILL and
// restarts it on the same data dir: retained messages, persistent sessions
// (MQTT 3.1.1 clean session false, MQTT 5 session expiry), their
// subscriptions and their queued QoS 1 messages are all still there.
func TestSigkillKeepsSessionsAndRetained(t *testing.T) {
	dataDir := t.TempDir()
	p := startKeyline(t, dataDir) // fsync on: the default
	addr := p.addrs["tcp"]
	url := mqtttest.V3URL(mqtttest.TCP, addr)

	// Two persistent sessions subscribe, then go away.
	mqtttest.AwayV3(t, url, "device-fleet-agent", "jobs/#")
	expiry := uint32(3600)
	v5connect := &paho.Connect{ClientID: "worker-5", CleanStart: false, KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}
	v5, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), v5connect)
	if err != nil {
		t.Fatal(err)
	}
	v5.Subscribe(t, paho.SubscribeOptions{Topic: "jobs/#", QoS: 1})
	v5.Close()

	// Queue messages for both while they are away, then a retained message.
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "publisher", CleanStart: true, KeepAlive: 30})
	const queued = 5
	for i := range queued {
		pub.Publish(t, &paho.Publish{Topic: "jobs/build", QoS: 1, Payload: fmt.Appendf(nil, "job-%d", i)})
	}
	// A retained message is committed before its PUBACK, and the session
	// store commits in order, so this PUBACK also means the queued messages
	// above are on disk.
	if rc := pub.Publish(t, &paho.Publish{Topic: "config/site", QoS: 1, Retain: true, Payload: []byte("v42")}); rc != 0 {
		t.Fatalf("retained publish reason %#x", rc)
	}
	pub.Close()

	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d, want -1 (killed)", code)
	}

	p = startKeyline(t, dataDir)
	addr = p.addrs["tcp"]
	want := make([]string, queued)
	for i := range want {
		want[i] = fmt.Sprintf("job-%d", i)
	}
	check := func(who string, got []string, ids []uint16) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) { // in publish order
			t.Errorf("%s got %v after restart, want %v", who, got, want)
		}
		seen := map[uint16]bool{}
		for _, id := range ids {
			if id == 0 || seen[id] {
				t.Errorf("%s got packet ids %v: want distinct non-zero ids", who, ids)
			}
			seen[id] = true
		}
	}

	v5 = mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), v5connect)
	if !v5.Connack.SessionPresent {
		t.Error("MQTT 5 session not present after SIGKILL")
	}
	var got []string
	var ids []uint16
	for range queued {
		m := v5.Next(t)
		got, ids = append(got, string(m.Payload)), append(ids, m.PacketID)
	}
	check("MQTT 5 session", got, ids)

	v3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "device-fleet-agent", false, nil)
	got, ids = nil, nil
	for range queued {
		m := v3.Next(t)
		got, ids = append(got, string(m.Payload())), append(ids, m.MessageID())
	}
	check("MQTT 3.1.1 session", got, ids)

	// The subscriptions survived too: new messages still reach both sessions.
	pub = mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "publisher", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "jobs/deploy", QoS: 1, Payload: []byte("after")})
	if m := v5.Next(t); string(m.Payload) != "after" {
		t.Errorf("MQTT 5 session got %q after restart, want the new message", m.Payload)
	}
	if m := v3.Next(t); string(m.Payload()) != "after" {
		t.Errorf("MQTT 3.1.1 session got %q after restart, want the new message", m.Payload())
	}

	reader := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "reader", CleanStart: true, KeepAlive: 30})
	reader.Subscribe(t, paho.SubscribeOptions{Topic: "config/#", QoS: 1})
	if m := reader.Next(t); string(m.Payload) != "v42" || !m.Retain {
		t.Errorf("retained after SIGKILL = %q retain=%v, want v42", m.Payload, m.Retain)
	}
}

// TestSigkillKeepsQueueOrderAndDUP: 1,200 QoS 1 messages queued for two
// persistent sessions (MQTT 3.1.1 away; MQTT 5 connected, with 10 of them in
// flight and unacknowledged) survive SIGKILL and come back in publish order:
// the away session's without DUP (never sent), the in-flight ones first with
// DUP and their packet ids.
func TestSigkillKeepsQueueOrderAndDUP(t *testing.T) {
	dataDir := t.TempDir()
	p := startKeyline(t, dataDir) // fsync on: the default
	addr := p.addrs["tcp"]
	url := mqtttest.V3URL(mqtttest.TCP, addr)
	mqtttest.AwayV3(t, url, "away", "q/#")
	wo := mqtttest.WorkerOptions{SessionExpiry: 3600, ReceiveMaximum: 10, KeepAlive: 30, Buffer: 2000}
	w, err := mqtttest.DialWorker(addr, "holding", wo)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := w.Subscribe("q/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}

	const n = 1200
	pub := mqtttest.ConnectV3(t, url, "pub", true, nil)
	t.Logf("%d messages queued in %v", n, pub.PublishSeq(t, "q/t", 1, n))
	ids := make([]uint16, 10)
	for i := range ids {
		m := w.Next(mqtttest.Timeout)
		if m == nil || m.Dup || string(m.Payload) != strconv.Itoa(i) {
			t.Fatalf("in flight %d: %+v", i, m)
		}
		ids[i] = m.PacketID
	}
	// The session store commits in order: once this retained message is
	// acknowledged (committed before its PUBACK), so are the queued ones.
	pub.Publish(t, "barrier", 1, true, []byte("b"))

	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d, want -1 (killed)", code)
	}
	w.Vanish()
	p = startKeyline(t, dataDir)
	addr = p.addrs["tcp"]

	v3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "away", false, nil)
	for i := range n {
		m := v3.Next(t)
		if string(m.Payload()) != strconv.Itoa(i) || m.Duplicate() {
			t.Fatalf("MQTT 3.1.1 session after SIGKILL: message %d is %q (dup %v), want %d without DUP", i, m.Payload(), m.Duplicate(), i)
		}
	}
	wo.Buffer = n
	w, err = mqtttest.DialWorker(addr, "holding", wo)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if !w.Connack().SessionPresent {
		t.Fatal("MQTT 5 session not present after SIGKILL")
	}
	for i := range n {
		m := w.Next(mqtttest.Timeout)
		if m == nil || string(m.Payload) != strconv.Itoa(i) {
			t.Fatalf("MQTT 5 session after SIGKILL: message %d is %+v", i, m)
		}
		if i < len(ids) && (!m.Dup || m.PacketID != ids[i]) {
			t.Fatalf("in-flight message %d resent with dup %v id %d, want DUP and id %d", i, m.Dup, m.PacketID, ids[i])
		}
		if err := w.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
}
