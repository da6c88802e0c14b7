package broker

import (
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// TestClusterWillCancelledByReconnectElsewhere: a client whose connection
// to node a dropped comes back on node b before its will delay ends; node
// a, alive, does not publish the will to its own subscribers (nor does
// anyone else), while the will of a client that does not come back goes
// out when due. It failed before mochi fork item 23: node a published the
// first will to its local subscribers when the delay ended.
func TestClusterWillCancelledByReconnectElsewhere(t *testing.T) {
	nc := natstest.Start(t, 1)
	bs := startClusterBrokers(t, 2, nc.URLs())
	a, b := bs[0], bs[1]
	subA := dialV5(t, a, &paho.Connect{ClientID: "sub-a", CleanStart: true, KeepAlive: 30})
	subA.Subscribe(t, paho.SubscribeOptions{Topic: "wills/#", QoS: 1})
	subB := dialV5(t, b, &paho.Connect{ClientID: "sub-b", CleanStart: true, KeepAlive: 30})
	subB.Subscribe(t, paho.SubscribeOptions{Topic: "wills/#", QoS: 1})

	expiry := uint32(60)
	dropWithWill := func(id string, delay uint32) {
		conn := mqtttest.Dial(t, mqtttest.TCP, a.Addr("tcp"), nil)
		mqtttest.ConnectV5(t, conn, &paho.Connect{ClientID: id, KeepAlive: 30,
			Properties:     &paho.ConnectProperties{SessionExpiryInterval: &expiry},
			WillMessage:    &paho.WillMessage{Topic: "wills/" + id, QoS: 1, Payload: []byte(id)},
			WillProperties: &paho.WillProperties{WillDelayInterval: &delay}})
		_ = conn.Close() // without DISCONNECT: the will is pending
	}
	dropWithWill("back", 2)
	dropWithWill("sentinel", 3) // due after "back"
	dialV5(t, b, &paho.Connect{ClientID: "back", KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})

	for name, sub := range map[string]*mqtttest.V5{"a": subA, "b": subB} {
		select {
		case m := <-sub.Msgs:
			if m.Topic != "wills/sentinel" {
				t.Fatalf("node %s subscriber got %s %q, want only the sentinel's will", name, m.Topic, m.Payload)
			}
		case <-time.After(2 * mqtttest.Timeout):
			t.Fatalf("node %s subscriber: no will", name)
		}
	}
	expectNone(t, subA, "sub-a")
	expectNone(t, subB, "sub-b")
	if n := a.ClusterHook().Stats.Wills.Load() + b.ClusterHook().Stats.Wills.Load(); n != 0 {
		t.Errorf("%d wills published for gone nodes, none is gone", n)
	}
}
