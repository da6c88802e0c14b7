package broker

import (
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestDelayedWill: an MQTT 5 client (paho.golang) with session expiry 5 s
// and a will with Will Delay Interval 3 s drops its socket; its will reaches
// a subscriber no sooner than 3 s later [MQTT-3.1.3-9], and a client that
// comes back within the delay cancels it. The waits are wall-clock on
// purpose: the delay is what is tested, and mochi counts it in whole seconds.
func TestDelayedWill(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "sub", CleanStart: true, KeepAlive: 30})
	if rc := sub.Subscribe(t, paho.SubscribeOptions{Topic: "wills/#", QoS: 1}); rc[0] != 1 {
		t.Fatalf("SUBACK %#x", rc[0])
	}
	connect := func(id string, clean bool, payload string) {
		t.Helper()
		expiry, delay := uint32(5), uint32(3)
		conn := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
		mqtttest.ConnectV5(t, conn, &paho.Connect{ClientID: id, CleanStart: clean, KeepAlive: 30,
			Properties:     &paho.ConnectProperties{SessionExpiryInterval: &expiry},
			WillMessage:    &paho.WillMessage{Topic: "wills/" + id, QoS: 1, Payload: []byte(payload)},
			WillProperties: &paho.WillProperties{WillDelayInterval: &delay}})
		_ = conn.Close() // the socket drops without DISCONNECT
	}

	start := time.Now()
	connect("dev", true, "dev gone")
	connect("back", true, "first will")
	connect("back", false, "second will") // within the delay: the first will is cancelled [MQTT-3.1.3-9]
	backAgain := time.Now()
	due := map[string]time.Time{"dev gone": start, "second will": backAgain} // both fall due in the same second: either may come first
	for range 2 {
		m := sub.Next(t)
		since, ok := due[string(m.Payload)]
		if !ok {
			t.Fatalf("will %s %q: not expected (again)", m.Topic, m.Payload)
		}
		delete(due, string(m.Payload))
		if took := time.Since(since); took < 3*time.Second {
			t.Fatalf("will %q sent after %v, before its delay of 3 s", m.Payload, took)
		} else {
			t.Logf("will %q after %v", m.Payload, took)
		}
	}
	select {
	case m := <-sub.Msgs:
		t.Fatalf("a cancelled will was sent: %q", m.Payload)
	case <-time.After(1500 * time.Millisecond): // wall clock: mochi checks delayed wills once a second
	}
}
