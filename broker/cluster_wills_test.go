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
	bs := startClusterBrokers(t, 2, natstest.Start(t, 1).URLs())
	a, b := bs[0], bs[1]
	subs := map[string]*mqtttest.V5{}
	for name, node := range map[string]*Broker{"a": a, "b": b} {
		subs[name] = dialV5(t, node, &paho.Connect{ClientID: "sub-" + name, CleanStart: true, KeepAlive: 30})
		subs[name].Subscribe(t, paho.SubscribeOptions{Topic: "wills/#", QoS: 1})
	}

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

	for name, sub := range subs {
		select {
		case m := <-sub.Msgs:
			if m.Topic != "wills/sentinel" {
				t.Fatalf("node %s subscriber got %s %q, want only the sentinel's will", name, m.Topic, m.Payload)
			}
		case <-time.After(2 * mqtttest.Timeout):
			t.Fatalf("node %s subscriber: no will", name)
		}
	}
	for name, sub := range subs {
		expectNone(t, sub, "sub-"+name)
	}
	if n := a.ClusterHook().Stats.Wills.Load() + b.ClusterHook().Stats.Wills.Load(); n != 0 {
		t.Errorf("%d wills published for gone nodes, none is gone", n)
	}
}
