package broker

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestDeadLettersReachDLQGroupsBestEffort: a group on the dead-letter topics
// ($share/ops/$dlq/#, its member paho.golang at QoS 1) gets each dead letter
// at QoS 0, with the dlq-* properties, never logged and never acknowledged:
// the dead letter is stored with the group it died in, and one that died in
// the $dlq group again would come back on $dlq/... without end.
func TestDeadLettersReachDLQGroupsBestEffort(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	ops := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "ops", CleanStart: true, KeepAlive: 30})
	if rc := ops.Subscribe(t, paho.SubscribeOptions{Topic: "$share/ops/$dlq/#", QoS: 1}); rc[0] != 1 {
		t.Fatalf("SUBACK %#x", rc[0])
	}
	w, err := mqtttest.DialWorker(addr, "worker", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	if rc, err := w.Subscribe("$share/pay/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte("poison")})
	m := w.Next(mqtttest.Timeout)
	if m == nil {
		t.Fatal("the worker got nothing")
	}
	if err := w.Nack(m, mqtttest.ReasonNotAuthorized); err != nil { // never retried: dead-lettered at once
		t.Fatal(err)
	}

	d := ops.Next(t)
	props := map[string]string{}
	if d.Properties != nil {
		for _, u := range d.Properties.User {
			props[u.Key] = u.Value
		}
	}
	if d.Topic != "$dlq/pay/jobs/x" || string(d.Payload) != "poison" || props["dlq-group"] != "pay/jobs/#" || props["dlq-reason"] != "0x87" {
		t.Fatalf("dead letter %s %q %v", d.Topic, d.Payload, props)
	}
	if d.QoS != 0 {
		t.Fatalf("dead letter delivered to the $dlq group at QoS %d, want 0 (best effort)", d.QoS)
	}
	var g adminapi.GroupView
	apiJSON(t, http.MethodGet, "http://"+b.Addr("http")+adminapi.PathGroupDetail+"?group="+url.QueryEscape("ops/$dlq/#"), "", http.StatusOK, &g)
	if g.Head != 0 || g.InFlight != 0 || g.Backlog != 0 {
		t.Fatalf("the $dlq group logged or tracks the dead letter: head %d, in flight %d, backlog %d", g.Head, g.InFlight, g.Backlog)
	}
	if cl, ok := b.Server().Clients.Get("ops"); !ok || cl.State.Inflight.Len() != 0 {
		t.Fatalf("the $dlq member holds %d messages in flight", cl.State.Inflight.Len())
	}
}
