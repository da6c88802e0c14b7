package integration

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/internal/sessionstate"
)

// willCounter counts the messages a subscriber got, by topic, with when
// each topic first arrived.
type willCounter struct {
	c     *mqtttest.V5
	count map[string]int
	first map[string]time.Time
	// retained counts those that arrived with the retain flag set.
	retained map[string]int
}

func newWillCounter(t *testing.T, addr, id, filter string) *willCounter {
	t.Helper()
	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
	if rc := c.Subscribe(t, paho.SubscribeOptions{Topic: filter, QoS: 1}); rc[0] > 1 {
		t.Fatalf("%s: SUBACK %#x", id, rc[0])
	}
	return &willCounter{c: c, count: map[string]int{}, first: map[string]time.Time{}, retained: map[string]int{}}
}

// waitFor reads messages until topic has arrived, within mqtttest.Timeout.
func (w *willCounter) waitFor(t *testing.T, topic string) {
	t.Helper()
	deadline := time.After(2 * mqtttest.Timeout)
	for w.count[topic] == 0 {
		select {
		case m := <-w.c.Msgs:
			if w.count[m.Topic] == 0 {
				w.first[m.Topic] = time.Now()
			}
			w.count[m.Topic]++
			if m.Retain {
				w.retained[m.Topic]++
			}
		case <-deadline:
			t.Fatalf("%s never arrived (got %v)", topic, w.count)
		}
	}
}

// connectWithWill connects an MQTT 5 client to addr with a will on
// wills/<id> (delay seconds, session expiry seconds).
func connectWithWill(t *testing.T, addr, id string, delay, expiry uint32, retain bool) *mqtttest.V5 {
	t.Helper()
	return connectWithWillOn(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), id, delay, expiry, retain)
}

// connectWithWillOn is connectWithWill over conn.
func connectWithWillOn(t *testing.T, conn net.Conn, id string, delay, expiry uint32, retain bool) *mqtttest.V5 {
	t.Helper()
	return mqtttest.ConnectV5(t, conn, &paho.Connect{
		ClientID: id, CleanStart: true, KeepAlive: 30,
		Properties:     &paho.ConnectProperties{SessionExpiryInterval: &expiry},
		WillMessage:    &paho.WillMessage{Topic: "wills/" + id, QoS: 1, Retain: retain, Payload: []byte("gone:" + id)},
		WillProperties: &paho.WillProperties{WillDelayInterval: &delay},
	})
}

// TestClusterWillsOfKilledNode SIGKILLs a node holding clients with wills:
// the two surviving nodes publish each will once between them, to the
// subscribers of both, a delayed one after its delay (and retained, as it
// was), none of a client that reconnected to a survivor before its delay
// ended, and none of a client that disconnected normally.
func TestClusterWillsOfKilledNode(t *testing.T) {
	nc := natstest.Start(t, 1)
	urls := nc.URLs()
	// The survivors first: they hear the dying node's figures from its start.
	b := startClusterNode(t, "node-b", urls)
	c := startClusterNode(t, "node-c", urls)
	a := startClusterNode(t, "node-a", urls)
	subB := newWillCounter(t, b.addrs["tcp"], "sub-b", "wills/#")
	subC := newWillCounter(t, c.addrs["tcp"], "sub-c", "wills/#")

	connectWithWill(t, a.addrs["tcp"], "now", 0, 0, false)              // no delay, clean
	connectWithWill(t, a.addrs["tcp"], "delayed", 4, 60, true)          // after 4 s, retained
	connectWithWill(t, a.addrs["tcp"], "back", 5, 60, false)            // reconnects to b first
	connectWithWill(t, a.addrs["tcp"], "sentinel", 6, 60, false)        // due after "back"
	graceful := connectWithWill(t, a.addrs["tcp"], "bye", 0, 60, false) // DISCONNECT 0x00
	mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, a.addrs["tcp"]), "v311", false, nil, func(o *mqtt3.ClientOptions) {
		o.SetWill("wills/v311", "gone:v311", 1, false) // 3.1.1, persistent session: no delay
	})
	graceful.Close()
	// Node a has taken the DISCONNECT in (not only been sent it) before it dies.
	if !mqtttest.Within(mqtttest.Timeout, func() bool { return recordWill(t, urls, "bye") == "none" }) {
		t.Fatalf("the record of bye still holds its will after its DISCONNECT")
	}

	killed := time.Now()
	killNode(t, a)
	// "back" comes back on b before its will delay ends: its will is cancelled.
	expiry := uint32(60)
	back := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.addrs["tcp"], nil), &paho.Connect{
		ClientID: "back", KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
	if since := time.Since(killed); since >= 5*time.Second {
		t.Fatalf("reconnect took %v, past the will delay", since)
	}

	for _, sub := range []*willCounter{subB, subC} {
		for _, topic := range []string{"wills/now", "wills/v311", "wills/delayed", "wills/sentinel"} {
			sub.waitFor(t, topic)
		}
	}
	t.Logf("after the kill: the will without delay in %v, the 4 s one in %v",
		subB.first["wills/now"].Sub(killed).Round(time.Millisecond), subB.first["wills/delayed"].Sub(killed).Round(time.Millisecond))
	if d := subB.first["wills/delayed"].Sub(killed); d < 4*time.Second {
		t.Fatalf("the delayed will arrived %v after the kill, before its delay (4 s)", d)
	}
	// The sentinel was due after "back" and "bye": had either been published
	// it would have arrived before it, on the same path.
	for name, sub := range map[string]*willCounter{"b": subB, "c": subC} {
		for _, topic := range []string{"wills/now", "wills/v311", "wills/delayed", "wills/sentinel"} {
			if sub.count[topic] != 1 {
				t.Errorf("node %s subscriber got %s %d times, want once", name, topic, sub.count[topic])
			}
		}
		for _, topic := range []string{"wills/back", "wills/bye"} {
			if sub.count[topic] != 0 {
				t.Errorf("node %s subscriber got %s, which must not be published", name, topic)
			}
		}
	}
	if n := b.metric(t, "keyline_cluster_wills_published_total") + c.metric(t, "keyline_cluster_wills_published_total"); n != 4 {
		t.Errorf("survivors published %v wills, want 4", n)
	}
	// The delayed will was retained: a new subscriber on c gets it.
	late := newWillCounter(t, c.addrs["tcp"], "late", "wills/delayed")
	late.waitFor(t, "wills/delayed")
	if late.retained["wills/delayed"] != 1 {
		t.Errorf("the retained will reached a new subscriber without the retain flag")
	}
	back.Close()
}

// willNodes starts node b then node a on one NATS server, with a
// subscriber to every will on b.
func willNodes(t *testing.T) (urls []string, a, b *proc, subB *willCounter) {
	t.Helper()
	urls = natstest.Start(t, 1).URLs()
	b = startClusterNode(t, "node-b", urls) // first: it hears a's figures from a's start
	a = startClusterNode(t, "node-a", urls)
	return urls, a, b, newWillCounter(t, b.addrs["tcp"], "sub-b", "wills/#")
}

// killNode SIGKILLs p.
func killNode(t *testing.T, p *proc) {
	t.Helper()
	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d, want -1 (killed)", code)
	}
}

// TestClusterWillsOfNodeRestartedUnderItsID SIGKILLs a node and starts it
// again at once under the same id: the wills of the clients it held are
// published once, by it (it knows its earlier run's records) or by the
// other node, never by both.
func TestClusterWillsOfNodeRestartedUnderItsID(t *testing.T) {
	urls, a, b, subB := willNodes(t)
	connectWithWill(t, a.addrs["tcp"], "now", 0, 0, false)
	connectWithWill(t, a.addrs["tcp"], "delayed", 2, 60, false)
	connectWithWill(t, a.addrs["tcp"], "sentinel", 4, 60, false)
	killNode(t, a)
	a2 := startClusterNode(t, "node-a", urls)
	for _, topic := range []string{"wills/now", "wills/delayed", "wills/sentinel"} {
		subB.waitFor(t, topic)
	}
	for _, topic := range []string{"wills/now", "wills/delayed"} {
		if subB.count[topic] != 1 {
			t.Errorf("got %s %d times, want once", topic, subB.count[topic])
		}
	}
	if n := b.metric(t, "keyline_cluster_wills_published_total") + a2.metric(t, "keyline_cluster_wills_published_total"); n != 3 {
		t.Errorf("the nodes published %v wills, want 3", n)
	}
}

// TestClusterWillSentByItsNodeIsNotSentAgain: a delayed will that the
// client's own node sent leaves the session record, so when that node is
// SIGKILLed afterwards the other node does not send it again.
func TestClusterWillSentByItsNodeIsNotSentAgain(t *testing.T) {
	urls, a, _, subB := willNodes(t)
	conn := mqtttest.Dial(t, mqtttest.TCP, a.addrs["tcp"], nil)
	connectWithWillOn(t, conn, "early", 1, 60, false)
	_ = conn.Close() // without DISCONNECT: node a sends the will after 1 s
	subB.waitFor(t, "wills/early")
	if !mqtttest.Within(mqtttest.Timeout, func() bool { return recordWill(t, urls, "early") == "none" }) {
		t.Fatalf("the record of early still holds its will after node a sent it")
	}
	connectWithWill(t, a.addrs["tcp"], "sentinel", 0, 0, false)
	killNode(t, a)
	// Both are due at once on node b: the sentinel's arrival means the
	// other would have come too.
	subB.waitFor(t, "wills/sentinel")
	if subB.count["wills/early"] != 1 {
		t.Fatalf("got the will of early %d times, want once", subB.count["wills/early"])
	}
}

// recordWill reads client id's session record from KL_SESSIONS: "none"
// when it holds no will, the will's topic, or "" when there is no record.
func recordWill(t *testing.T, urls []string, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "KL_SESSIONS")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		rec, _, err := sessionrec.DecodeWithID(e.Value())
		if err != nil || rec.ClientID != id {
			continue
		}
		st, err := sessionstate.DecodeCluster(id, rec.State)
		if err != nil || st.Client.Will.Flag == 0 {
			return "none"
		}
		return st.Client.Will.TopicName
	}
	return ""
}
