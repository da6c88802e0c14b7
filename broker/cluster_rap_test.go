package broker

import (
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/natstest"
)

// A live retained publish reaches the subscribers of another node with the
// retain flag as one node gives it: kept for retain-as-published, cleared
// for the rest [MQTT-3.3.1-12] [MQTT-3.3.1-13]; and the live copy does not
// become the other node's retained state (that comes from the stream).
func TestClusterRetainAsPublishedAcrossNodes(t *testing.T) {
	nc := natstest.Start(t, 1)
	bs := startClusterBrokers(t, 2, nc.URLs())
	a, b := bs[0], bs[1]

	rap := dialV5(t, b, &paho.Connect{ClientID: "rap", CleanStart: true, KeepAlive: 30})
	rap.Subscribe(t, paho.SubscribeOptions{Topic: "rap/#", QoS: 1, RetainAsPublished: true})
	plain := dialV5(t, b, &paho.Connect{ClientID: "plain", CleanStart: true, KeepAlive: 30})
	plain.Subscribe(t, paho.SubscribeOptions{Topic: "rap/#", QoS: 1})
	pub := dialV5(t, a, &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	warmCore(t, pub, "rap/probe", rap, plain)
	for _, qos := range []byte{0, 1} {
		pub.Publish(t, &paho.Publish{Topic: "rap/x", QoS: qos, Retain: true, Payload: []byte{'r', '0' + qos}})
		pub.Publish(t, &paho.Publish{Topic: "rap/x", QoS: qos, Payload: []byte{'n', '0' + qos}})
		for _, want := range []struct {
			payload string
			retain  bool
		}{{string([]byte{'r', '0' + qos}), true}, {string([]byte{'n', '0' + qos}), false}} {
			if m := rap.Next(t); string(m.Payload) != want.payload || m.Retain != want.retain {
				t.Fatalf("qos %d: retain-as-published subscriber got %q retain=%v, want %q retain=%v", qos, m.Payload, m.Retain, want.payload, want.retain)
			}
			if m := plain.Next(t); string(m.Payload) != want.payload || m.Retain {
				t.Fatalf("qos %d: ordinary subscriber got %q retain=%v, want %q retain=false", qos, m.Payload, m.Retain, want.payload)
			}
		}
	}
	late := dialV5(t, b, &paho.Connect{ClientID: "late", CleanStart: true, KeepAlive: 30})
	late.Subscribe(t, paho.SubscribeOptions{Topic: "rap/x", QoS: 1})
	if m := late.Next(t); string(m.Payload) != "r1" || !m.Retain {
		t.Fatalf("retained state on node b: got %q retain=%v, want r1 retained", m.Payload, m.Retain)
	}
	expectNone(t, late, "late")
}
