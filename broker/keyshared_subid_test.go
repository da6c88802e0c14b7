package broker

import (
	"context"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestKeySharedDeliveriesCarryTheSubscriptionIdentifier: a member that
// subscribed `$share/g/t` with a Subscription Identifier gets it on every
// message of the group [MQTT-3.3.4-3] (paho.golang as the member): logged
// QoS 1 deliveries, QoS 0 publishes routed on the ring, QoS 1 messages to a
// member granted QoS 0, after a re-subscribe with another identifier, and
// after a restart that restored the session from the data file.
func TestKeySharedDeliveriesCarryTheSubscriptionIdentifier(t *testing.T) {
	cfg := testConfig(t)
	b := startBroker(t, cfg)
	member := func(b *Broker, clean bool) *mqtttest.V5 {
		expiry := uint32(300)
		return mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil),
			&paho.Connect{ClientID: "member", CleanStart: clean, KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
	}
	subscribe := func(c *mqtttest.V5, filter string, qos byte, id int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
		defer cancel()
		sa, err := c.Client.Subscribe(ctx, &paho.Subscribe{
			Properties:    &paho.SubscribeProperties{SubscriptionIdentifier: &id},
			Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}},
		})
		if err != nil || sa.Reasons[0] != qos {
			t.Fatalf("subscribe %s: %v %v", filter, sa, err)
		}
	}
	expect := func(c *mqtttest.V5, payload string, qos byte, id int) {
		t.Helper()
		m := c.Next(t)
		got := 0
		if m.Properties != nil && m.Properties.SubscriptionIdentifier != nil {
			got = *m.Properties.SubscriptionIdentifier
		}
		if string(m.Payload) != payload || m.QoS != qos || got != id {
			t.Fatalf("got %q at QoS %d with subscription identifier %d, want %q at QoS %d with %d", m.Payload, m.QoS, got, payload, qos, id)
		}
	}
	publish := func(b *Broker, topic, payload string, qos byte) {
		t.Helper()
		pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
		defer pub.Close()
		if rc := pub.Publish(t, &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(payload)}); rc != 0 {
			t.Fatalf("publish %s: reason %#x", topic, rc)
		}
	}

	m := member(b, true)
	subscribe(m, "$share/g/jobs/#", 1, 42)
	subscribe(m, "$share/low/events/#", 0, 7)
	publish(b, "jobs/a", "logged", 1)
	expect(m, "logged", 1, 42)
	publish(b, "jobs/a", "routed", 0)
	expect(m, "routed", 0, 42)
	publish(b, "events/a", "logged to a QoS 0 member", 1)
	expect(m, "logged to a QoS 0 member", 0, 7)

	subscribe(m, "$share/g/jobs/#", 1, 43) // the identifier of the newest SUBSCRIBE applies
	publish(b, "jobs/a", "re-subscribed", 1)
	expect(m, "re-subscribed", 1, 43)
	m.Close()

	// The session and its subscription come back from the data file.
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	b = startBroker(t, cfg)
	m = member(b, false)
	publish(b, "jobs/a", "after a restart", 1)
	for { // the previous message comes again if its PUBACK did not arrive before the client closed (at least once)
		got := m.Next(t)
		id := 0
		if got.Properties != nil && got.Properties.SubscriptionIdentifier != nil {
			id = *got.Properties.SubscriptionIdentifier
		}
		if id != 43 {
			t.Fatalf("after the restart %q came with subscription identifier %d, want 43", got.Payload, id)
		}
		if string(got.Payload) == "after a restart" {
			break
		}
	}
}
