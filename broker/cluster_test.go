package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/sessionstore"
)

// startClusterBrokers starts n Keyline nodes on one NATS cluster, node i
// connected to NATS server i (mod the servers).
func startClusterBrokers(t *testing.T, n int, urls []string) []*Broker {
	t.Helper()
	var out []*Broker
	for i := range n {
		cfg := testConfig(t)
		cfg.Cluster.NATS = []string{urls[i%len(urls)]}
		cfg.Cluster.NodeID = fmt.Sprintf("node-%c", 'a'+i)
		out = append(out, startBroker(t, cfg))
	}
	return out
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	mqtttest.Eventually(t, d, what, cond)
}

func dialV5(t *testing.T, b *Broker, cp *paho.Connect) *mqtttest.V5 {
	t.Helper()
	return mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil), cp)
}

// expectNone fails if c receives a message within a short while.
func expectNone(t *testing.T, c *mqtttest.V5, who string) {
	t.Helper()
	select {
	case m := <-c.Msgs:
		t.Fatalf("%s got an extra message %s %q", who, m.Topic, m.Payload)
	case <-time.After(200 * time.Millisecond):
	}
}

// warmCore publishes QoS 0 probes on topic until every subscriber got one,
// then drains them: core NATS interest reaches the other servers
// asynchronously after the SUBACK.
func warmCore(t *testing.T, pub *mqtttest.V5, topic string, subs ...*mqtttest.V5) {
	t.Helper()
	got := make([]bool, len(subs))
	waitFor(t, 10*time.Second, "QoS 0 interest to reach every NATS server", func() bool {
		pub.Publish(t, &paho.Publish{Topic: topic, QoS: 0, Payload: []byte("probe")}) // paced by the poll
		all := true
		for i, s := range subs {
			for !got[i] {
				select {
				case <-s.Msgs:
					got[i] = true
				default:
				}
				break
			}
			all = all && got[i]
		}
		return all
	})
	// Drain the probes still on their way: a marker published after them
	// arrives after them.
	for _, s := range subs {
		pub.Publish(t, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("marker")})
		for {
			m := s.Next(t)
			if string(m.Payload) == "marker" {
				break
			}
		}
		for _, o := range subs {
			if o != s {
				for string(o.Next(t).Payload) != "marker" {
				}
			}
		}
	}
}

func TestClusterPubSubAcrossNodes(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 3, nc.URLs())
	a, b, c := bs[0], bs[1], bs[2]

	// Node b: one client with overlapping filters (one delivery per
	// message, at the highest granted QoS). Node c: QoS 0. Node a, the
	// publisher's node: QoS 1.
	subB := dialV5(t, b, &paho.Connect{ClientID: "sub-b", CleanStart: true, KeepAlive: 30})
	subB.Subscribe(t, paho.SubscribeOptions{Topic: "t/#", QoS: 2}, paho.SubscribeOptions{Topic: "t/+/x", QoS: 1}, paho.SubscribeOptions{Topic: "t/a/x", QoS: 0})
	subC := dialV5(t, c, &paho.Connect{ClientID: "sub-c", CleanStart: true, KeepAlive: 30})
	subC.Subscribe(t, paho.SubscribeOptions{Topic: "t/a/+", QoS: 0})
	subA := dialV5(t, a, &paho.Connect{ClientID: "sub-a", CleanStart: true, KeepAlive: 30})
	subA.Subscribe(t, paho.SubscribeOptions{Topic: "t/a/x", QoS: 1})
	// A node with interest elsewhere only.
	other := dialV5(t, c, &paho.Connect{ClientID: "other", CleanStart: true, KeepAlive: 30})
	other.Subscribe(t, paho.SubscribeOptions{Topic: "elsewhere/#", QoS: 1})

	pub := dialV5(t, a, &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	warmCore(t, pub, "t/a/x", subB, subC, subA)

	coreB, queuedB := b.ClusterNode().Stats.CoreReceived.Load(), b.ClusterNode().Stats.QueuedReceived.Load()
	coreC, queuedC := c.ClusterNode().Stats.CoreReceived.Load(), c.ClusterNode().Stats.QueuedReceived.Load()
	const rounds = 20
	for i := range rounds {
		for qos := byte(0); qos <= 2; qos++ {
			if rc := pub.Publish(t, &paho.Publish{Topic: "t/a/x", QoS: qos, Payload: fmt.Appendf(nil, "%d-%d", i, qos)}); rc >= 0x80 {
				t.Fatalf("publish reason %#x", rc)
			}
		}
	}
	check := func(name string, s *mqtttest.V5, maxQoS byte) {
		t.Helper()
		// Per publisher and QoS, the order is the publish order.
		next := map[byte]int{}
		for range rounds * 3 {
			m := s.Next(t)
			var i int
			var q byte
			if _, err := fmt.Sscanf(string(m.Payload), "%d-%d", &i, &q); err != nil {
				t.Fatalf("%s: unexpected payload %q", name, m.Payload)
			}
			if i != next[q] {
				t.Fatalf("%s: got round %d of QoS %d, want round %d (lost, duplicated or reordered)", name, i, q, next[q])
			}
			next[q]++
			if want := min(q, maxQoS); m.QoS != want {
				t.Fatalf("%s: message %q at QoS %d, want %d", name, m.Payload, m.QoS, want)
			}
		}
		expectNone(t, s, name)
	}
	check("sub-b (overlapping filters)", subB, 2)
	check("sub-c", subC, 0)
	check("sub-a (publisher's node)", subA, 1)
	expectNone(t, other, "other")

	// One copy per interested node: node b got each QoS 0 message once over
	// core NATS and each QoS 1/2 message once through its consumer, although
	// three of its subscriptions match; node c likewise.
	if got := b.ClusterNode().Stats.CoreReceived.Load() - coreB; got != rounds {
		t.Errorf("node b received %d core messages for %d QoS 0 publishes", got, rounds)
	}
	if got := b.ClusterNode().Stats.QueuedReceived.Load() - queuedB; got != 2*rounds {
		t.Errorf("node b received %d queued messages for %d QoS 1/2 publishes", got, 2*rounds)
	}
	if got := c.ClusterNode().Stats.CoreReceived.Load() - coreC; got != rounds {
		t.Errorf("node c received %d core messages for %d QoS 0 publishes", got, rounds)
	}
	if got := c.ClusterNode().Stats.QueuedReceived.Load() - queuedC; got != 2*rounds {
		t.Errorf("node c received %d queued messages for %d QoS 1/2 publishes", got, 2*rounds)
	}
	// Node a is the publisher's node: it delivered locally and took nothing from NATS.
	if got := a.ClusterNode().Stats.CoreReceived.Load() + a.ClusterNode().Stats.QueuedReceived.Load(); got != 0 {
		t.Errorf("the publishing node received %d of its own messages back", got)
	}

	// A message to a topic only node c wants reaches node c only.
	before := b.ClusterNode().Stats.QueuedReceived.Load()
	pub.Publish(t, &paho.Publish{Topic: "elsewhere/1", QoS: 1, Payload: []byte("e")})
	if m := other.Next(t); string(m.Payload) != "e" {
		t.Fatalf("other got %q", m.Payload)
	}
	if got := b.ClusterNode().Stats.QueuedReceived.Load() - before; got != 0 {
		t.Errorf("node b without interest received %d messages", got)
	}
}

func TestClusterRetainedAndWills(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 3, nc.URLs())
	a, b, c := bs[0], bs[1], bs[2]

	pub := dialV5(t, a, &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "cfg/site", QoS: 1, Retain: true, Payload: []byte("v1")})
	pub.Publish(t, &paho.Publish{Topic: "cfg/site", QoS: 1, Retain: true, Payload: []byte("v2")})
	pub.Publish(t, &paho.Publish{Topic: "cfg/gone", QoS: 1, Retain: true, Payload: []byte("x")})
	pub.Publish(t, &paho.Publish{Topic: "cfg/gone", QoS: 1, Retain: true, Payload: nil}) // deletes it

	// A subscriber on node c, right after the PUBACKs on node a.
	sub := dialV5(t, c, &paho.Connect{ClientID: "sub", CleanStart: true, KeepAlive: 30})
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "cfg/#", QoS: 1})
	m := sub.Next(t)
	if string(m.Payload) != "v2" || !m.Retain || m.Topic != "cfg/site" {
		t.Fatalf("got %s %q retain=%v, want cfg/site v2 retained", m.Topic, m.Payload, m.Retain)
	}
	expectNone(t, sub, "sub")

	// A will from a client of node b reaches a subscriber on node c.
	willSub := dialV5(t, c, &paho.Connect{ClientID: "will-sub", CleanStart: true, KeepAlive: 30})
	willSub.Subscribe(t, paho.SubscribeOptions{Topic: "wills/#", QoS: 1})
	conn := mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil)
	mqtttest.ConnectV5(t, conn, &paho.Connect{ClientID: "dying", CleanStart: true, KeepAlive: 30,
		WillMessage: &paho.WillMessage{Topic: "wills/dying", QoS: 1, Payload: []byte("gone")}})
	_ = conn.Close() // without DISCONNECT: the will goes out
	select {
	case m = <-willSub.Msgs:
	case <-time.After(mqtttest.Timeout):
		// Lost 1 in 18 runs under load, root cause not found (no loss path in
		// the code read, none reproduced with these counters): they say
		// where the will stopped the next time.
		t.Fatalf("will: none within %v; %s", mqtttest.Timeout, clusterCounters(b, c))
	}
	if string(m.Payload) != "gone" || m.Topic != "wills/dying" {
		t.Fatalf("will: got %s %q", m.Topic, m.Payload)
	}

	// A node that starts later has the retained messages.
	cfg := testConfig(t)
	cfg.Cluster.NATS = nc.URLs()
	cfg.Cluster.NodeID = "node-late"
	late := startBroker(t, cfg)
	lateSub := dialV5(t, late, &paho.Connect{ClientID: "late-sub", CleanStart: true, KeepAlive: 30})
	lateSub.Subscribe(t, paho.SubscribeOptions{Topic: "cfg/site", QoS: 0})
	if m := lateSub.Next(t); string(m.Payload) != "v2" {
		t.Fatalf("late node: got %q", m.Payload)
	}
}

// clusterCounters describes where QoS 1/2 messages went on each node: stored
// in KL_MSGS, read by its consumer, handed to mochi, queued in a session.
func clusterCounters(bs ...*Broker) string {
	var out []string
	for _, b := range bs {
		n, h := b.ClusterNode(), b.ClusterHook()
		st := &n.Stats
		out = append(out, fmt.Sprintf("%s: filters %v, KL_MSGS stored %d, consumer at %d (received %d, own %d, redelivered %d, updates %d), "+
			"hook forwarded %d (errors %d), delivered %d, expired %d, fan-out tracked %d",
			n.NodeID(), n.Filters(), st.QueuedPublished.Load(), n.QueuedPosition(), st.QueuedReceived.Load(), st.QueuedOwn.Load(),
			st.QueuedRedeliver.Load(), st.ConsumerUpdates.Load(), h.Stats.Forwarded.Load(), h.Stats.ForwardErrors.Load(),
			h.Stats.Delivered.Load(), h.Stats.Expired.Load(), b.fanout.Stats.Tracked.Load()))
	}
	return strings.Join(out, "; ")
}

// client5 is an MQTT 5 client that records the server's DISCONNECT.
type client5 struct {
	*mqtttest.V5
	disconnect chan byte
}

func connectPersistent(t *testing.T, b *Broker, id string, cleanStart bool) *client5 {
	t.Helper()
	c := &client5{disconnect: make(chan byte, 1)}
	conn := mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil)
	v := &mqtttest.V5{Msgs: make(chan *paho.Publish, 10000)}
	v.Client = paho.NewClient(paho.ClientConfig{
		ClientID: id, Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			v.Msgs <- r.Packet
			return true, nil
		}},
		OnServerDisconnect: func(d *paho.Disconnect) { c.disconnect <- d.ReasonCode },
	})
	expiry := uint32(3600)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := v.Client.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: cleanStart, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
	if err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	v.Connack = ca
	t.Cleanup(v.Close)
	c.V5 = v
	return c
}

func TestClusterSessionResumeAndTakeover(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 3, nc.URLs())
	a, b, c := bs[0], bs[1], bs[2]

	dev := connectPersistent(t, a, "dev-1", true)
	dev.Subscribe(t, paho.SubscribeOptions{Topic: "cmd/dev-1/#", QoS: 1}, paho.SubscribeOptions{Topic: "cmd/+/all", QoS: 2})
	dev.Close() // offline; the session stays on node a

	pub := dialV5(t, b, &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for i := range 10 {
		pub.Publish(t, &paho.Publish{Topic: "cmd/dev-1/x", QoS: 1, Payload: fmt.Appendf(nil, "q%d", i)})
	}
	pub.Publish(t, &paho.Publish{Topic: "cmd/any/all", QoS: 2, Payload: []byte("all")})
	pub.Publish(t, &paho.Publish{Topic: "cmd/dev-1/x", QoS: 0, Payload: []byte("qos0: not queued")})

	// Resume on node c: session present, subscriptions and the queued messages.
	dev = connectPersistent(t, c, "dev-1", false)
	if !dev.Connack.SessionPresent {
		t.Fatal("resumed on another node without session present")
	}
	var got []string
	for range 11 {
		got = append(got, string(dev.Next(t).Payload))
	}
	want := []string{"q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "all"}
	if !slices.Equal(got, want) {
		t.Fatalf("queued messages: got %q, want %q", got, want)
	}
	expectNone(t, dev.V5, "dev-1")
	// The subscriptions came along: live messages arrive on node c.
	pub.Publish(t, &paho.Publish{Topic: "cmd/dev-1/live", QoS: 1, Payload: []byte("live")})
	if m := dev.Next(t); string(m.Payload) != "live" {
		t.Fatalf("live: got %q", m.Payload)
	}
	// Node a dropped its copy.
	waitFor(t, 5*time.Second, "node a to drop the session", func() bool {
		_, ok := a.Server().Clients.Get("dev-1")
		return !ok
	})

	// Takeover: the same id connects to node b while connected on node c.
	dev2 := connectPersistent(t, b, "dev-1", false)
	if !dev2.Connack.SessionPresent {
		t.Fatal("takeover without session present")
	}
	select {
	case rc := <-dev.disconnect:
		if rc != 0x8E {
			t.Fatalf("first connection got DISCONNECT %#x, want 0x8E", rc)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("first connection not disconnected")
	}
	pub.Publish(t, &paho.Publish{Topic: "cmd/dev-1/after", QoS: 1, Payload: []byte("after")})
	// "live" may come once more first: its PUBACK can still be on its way to
	// node c, or in the ~200 ms before c writes it to the session record,
	// when node b takes the session over (at least once; the README's
	// failure costs). Nothing else may.
	m := dev2.Next(t)
	if string(m.Payload) == "live" {
		m = dev2.Next(t)
	}
	if string(m.Payload) != "after" {
		t.Fatalf("after takeover: got %q", m.Payload)
	}
	expectNone(t, dev2.V5, "dev-1 on node b")
	if _, ok := c.Server().Clients.Get("dev-1"); ok {
		waitFor(t, 5*time.Second, "node c to drop the session", func() bool {
			_, ok := c.Server().Clients.Get("dev-1")
			return !ok
		})
	}

	// The admin API names the node holding each client: locally, and
	// cluster-wide from any node.
	if body := clusterGet(t, "http://"+b.Addr("http")+"/api/v1/clients/dev-1"); !strings.Contains(body, `"node": "node-b"`) {
		t.Fatalf("client view lacks its node: %s", body)
	}
	var list adminapi.ClusterClientList
	waitFor(t, 5*time.Second, "the cluster client list", func() bool {
		list = adminapi.ClusterClientList{}
		if err := json.Unmarshal([]byte(clusterGet(t, "http://"+a.Addr("http")+adminapi.PathClusterClients)), &list); err != nil {
			t.Fatal(err)
		}
		return slices.Contains(list.Clients, adminapi.ClusterClientView{ID: "dev-1", Node: "node-b", Connected: true, Persistent: true}) &&
			slices.Contains(list.Clients, adminapi.ClusterClientView{ID: "pub", Node: "node-b", Connected: true})
	})

	// $SYS: this node's id and the cluster totals.
	sys := dialV5(t, c, &paho.Connect{ClientID: "sys", CleanStart: true, KeepAlive: 30})
	sys.Subscribe(t, paho.SubscribeOptions{Topic: "$SYS/cluster/#", QoS: 0}, paho.SubscribeOptions{Topic: "$SYS/broker/cluster/node", QoS: 0})
	seen := map[string]string{}
	waitFor(t, 15*time.Second, "$SYS cluster totals", func() bool {
		for drained := false; !drained; {
			select {
			case m := <-sys.Msgs:
				seen[m.Topic] = string(m.Payload)
			default:
				drained = true
			}
		}
		// dev-1 and pub on node b, sys on node c.
		return seen["$SYS/broker/cluster/node"] == "node-c" && seen["$SYS/cluster/nodes"] == "3" && seen["$SYS/cluster/clients/connected"] == "3"
	})
}

func clusterGet(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func TestClusterRefusesConnectionsWithoutNATS(t *testing.T) {
	nc := natstest.Start(t, 1)
	cfg := testConfig(t)
	cfg.Cluster.NATS = nc.URLs()
	cfg.Cluster.NodeID = "solo"
	b := startBroker(t, cfg)
	ready := func() int {
		res, err := http.Get("http://" + b.Addr("http") + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	waitFor(t, 5*time.Second, "readyz 200", func() bool { return ready() == 200 })
	nc.Shutdown()
	waitFor(t, 15*time.Second, "readyz 503 without NATS", func() bool { return ready() == 503 })
	conn, err := net.Dial("tcp", b.Addr("tcp"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = mqtttest.TryConnectV5(conn, &paho.Connect{ClientID: "late", CleanStart: true, KeepAlive: 30})
	if err == nil || !strings.Contains(err.Error(), "136") && !strings.Contains(strings.ToLower(err.Error()), "unavailable") {
		t.Fatalf("connect without NATS: %v, want CONNACK 0x88 (server unavailable)", err)
	}
}

// TestClusterConcurrentConnectsOneOwner connects one client id to three
// nodes at once, a few times over: when the dust settles exactly one
// connection is alive and the session record names its node.
func TestClusterConcurrentConnectsOneOwner(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 3, nc.URLs())
	for round := range 3 {
		clients := make([]*client5, len(bs))
		done := make(chan int, len(bs))
		for i, b := range bs {
			go func() {
				defer func() { done <- i }()
				conn, err := net.Dial("tcp", b.Addr("tcp"))
				if err != nil {
					return
				}
				c := &client5{disconnect: make(chan byte, 1)}
				v := &mqtttest.V5{Msgs: make(chan *paho.Publish, 100)}
				v.Client = paho.NewClient(paho.ClientConfig{ClientID: "racer", Conn: conn,
					OnServerDisconnect: func(d *paho.Disconnect) { c.disconnect <- d.ReasonCode }})
				expiry := uint32(60)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if _, err := v.Client.Connect(ctx, &paho.Connect{ClientID: "racer", KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}); err != nil {
					_ = conn.Close()
					return
				}
				c.V5 = v
				clients[i] = c
			}()
		}
		for range bs {
			<-done
		}
		alive := func() []int {
			var out []int
			for i, c := range clients {
				if c == nil {
					continue
				}
				select {
				case <-c.Client.Done():
				default:
					if cl, ok := bs[i].Server().Clients.Get("racer"); ok && !cl.Closed() {
						out = append(out, i)
					}
				}
			}
			return out
		}
		waitFor(t, 10*time.Second, "one connection left", func() bool { return len(alive()) == 1 })
		winner := alive()[0]
		rec, _, err := bs[0].ClusterNode().SessionStore().Load(context.Background(), "racer")
		if err != nil || rec == nil {
			t.Fatalf("round %d: record %v %v", round, rec, err)
		}
		waitFor(t, 5*time.Second, "the record to name the winner", func() bool {
			rec, _, _ := bs[winner].ClusterNode().SessionStore().Load(context.Background(), "racer")
			return rec != nil && rec.Owner == bs[winner].NodeID() && rec.Connected
		})
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}
}

// TestClusterKeySharedAcrossNodes: a $share group is one group across the
// nodes: members on two nodes share its keys, publishes on either node are
// delivered once, in key order, and any node's admin API shows the whole
// group with each member's node; its dead letters are published live on
// every node.
func TestClusterKeySharedAcrossNodes(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 2, nc.URLs())
	a, b := bs[0], bs[1]
	ma := dialV5(t, a, &paho.Connect{ClientID: "member-a", CleanStart: true, KeepAlive: 30})
	ma.Subscribe(t, paho.SubscribeOptions{Topic: "$share/g/jobs/#", QoS: 1})
	mb := dialV5(t, b, &paho.Connect{ClientID: "member-b", CleanStart: true, KeepAlive: 30})
	mb.Subscribe(t, paho.SubscribeOptions{Topic: "$share/g/jobs/#", QoS: 1})
	plain := dialV5(t, a, &paho.Connect{ClientID: "plain", CleanStart: true, KeepAlive: 30})
	plain.Subscribe(t, paho.SubscribeOptions{Topic: "jobs/#", QoS: 1})
	waitFor(t, 15*time.Second, "both members at the group's holder", func() bool {
		st, err := b.keyShared.Group("g/jobs/#")
		return err == nil && st.Holder != "" && st.Stats.Members == 2
	})
	pubs := []*mqtttest.V5{
		dialV5(t, a, &paho.Connect{ClientID: "pub-a", CleanStart: true, KeepAlive: 30}),
		dialV5(t, b, &paho.Connect{ClientID: "pub-b", CleanStart: true, KeepAlive: 30}),
	}
	const keys, perKey = 20, 5
	for s := range perKey {
		for k := range keys {
			key := fmt.Sprintf("k%02d", k)
			rc := pubs[k%2].Publish(t, &paho.Publish{Topic: "jobs/" + key, QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", key, s),
				Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
			if rc >= 0x80 {
				t.Fatalf("publish reason %#x", rc)
			}
		}
	}
	next := map[string]int{}
	owner := map[string]string{}
	for range keys * perKey {
		var m *paho.Publish
		var who string
		select {
		case m = <-ma.Msgs:
			who = "member-a"
		case m = <-mb.Msgs:
			who = "member-b"
		case <-time.After(20 * time.Second):
			t.Fatalf("group deliveries stopped: %v", next)
		}
		key, seq, _ := strings.Cut(string(m.Payload), ":")
		if want := fmt.Sprint(next[key]); seq != want {
			t.Fatalf("key %s: got seq %s, want %s", key, seq, want)
		}
		next[key]++
		if o, ok := owner[key]; ok && o != who {
			t.Fatalf("key %s went to %s and %s", key, o, who)
		}
		owner[key] = who
	}
	expectNone(t, ma, "member-a")
	expectNone(t, mb, "member-b")
	for range keys * perKey {
		plain.Next(t)
	}
	nodes := map[string]bool{}
	for _, o := range owner {
		nodes[o] = true
	}
	if len(nodes) != 2 {
		t.Fatalf("keys went to %v only", nodes)
	}
	// Any node's admin API shows the members with their nodes.
	var v adminapi.GroupView
	apiJSON(t, "GET", "http://"+a.Addr("http")+adminapi.PathGroupDetail+"?group=g%2Fjobs%2F%23", "", 200, &v)
	if len(v.PerMember) != 2 || v.PerMember[0].Node != "node-a" || v.PerMember[1].Node != "node-b" || v.Holder == "" {
		t.Fatalf("group detail on node a: holder %q, members %+v", v.Holder, v.PerMember)
	}
	waitFor(t, 10*time.Second, "the cursor at the head", func() bool {
		apiJSON(t, "GET", "http://"+b.Addr("http")+adminapi.PathGroupDetail+"?group=g%2Fjobs%2F%23", "", 200, &v)
		return v.Head == keys*perKey && v.Cursor == v.Head && v.Counters.Acked == keys*perKey
	})
}

// TestClusterSweepsSessionsOfGoneNodes: records of sessions whose node is
// gone expire on another node; those of live nodes are left to them.
func TestClusterSweepsSessionsOfGoneNodes(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 2, nc.URLs())
	a, b := bs[0], bs[1]
	ctx := context.Background()
	now := time.Now()
	state := func(version byte, expiry uint32) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"client":{"protocolVersion":%d,"properties":{"sessionExpiryInterval":%d,"sessionExpiryIntervalFlag":true}}}`, version, expiry))
	}
	for _, rec := range []sessionstore.Record{
		{ClientID: "expired", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-100 * time.Second).Unix(), State: state(5, 10)},
		{ClientID: "young", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-100 * time.Second).Unix(), State: state(5, 3600)},
		{ClientID: "clean", Owner: "node-gone", Connected: true},
		// MQTT 3.1.1 sessions last max-session-expiry (a week by default).
		{ClientID: "v311", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-6 * 24 * time.Hour).Unix(), State: state(4, 0)},
		{ClientID: "v311-old", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-8 * 24 * time.Hour).Unix(), State: state(4, 0)},
		{ClientID: "was-connected", Owner: "node-gone", Persistent: true, Connected: true, State: state(5, 10)},
	} {
		if _, err := a.ClusterNode().SessionStore().Save(ctx, &rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	// A session node b holds, offline: b is alive, so it is b's to expire.
	held := connectPersistent(t, b, "held", true)
	held.Close()

	sweep := func(at time.Time) []string {
		t.Helper()
		deleted, err := a.ClusterHook().SweepOrphans(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(deleted)
		return deleted
	}
	if got := sweep(now); !slices.Equal(got, []string{"clean", "expired", "v311-old"}) {
		t.Fatalf("first sweep deleted %q, want clean, expired and v311-old", got)
	}
	// A session connected when its node died expires counted from when it
	// was first found orphaned.
	if got := sweep(now.Add(11 * time.Second)); !slices.Equal(got, []string{"was-connected"}) {
		t.Fatalf("second sweep deleted %q, want was-connected", got)
	}
	// Two hours on: young has expired; held (3600 s too) has a live owner.
	if got := sweep(now.Add(2 * time.Hour)); !slices.Equal(got, []string{"young"}) {
		t.Fatalf("third sweep deleted %q, want young", got)
	}
	for _, id := range []string{"v311", "held"} {
		if rec, _, err := a.ClusterNode().SessionStore().Load(ctx, id); err != nil || rec == nil {
			t.Errorf("%s: record %v %v, want kept", id, rec, err)
		}
	}
}

// TestClusterKeySharedDeadLettersAnyNode: a member on one node rejects a
// message; the dead letter is published live on the other node's $dlq/...,
// listed and replayed through the other node's admin API, and delivered
// again.
func TestClusterKeySharedDeadLettersAnyNode(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 2, nc.URLs())
	a, b := bs[0], bs[1]
	w, err := mqtttest.DialWorker(b.Addr("tcp"), "worker", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Disconnect() })
	if rc, err := w.Subscribe("$share/d/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	watcher := dialV5(t, a, &paho.Connect{ClientID: "dlq-watcher", CleanStart: true, KeepAlive: 30})
	watcher.Subscribe(t, paho.SubscribeOptions{Topic: "$dlq/#", QoS: 1})
	waitFor(t, 15*time.Second, "the member at the group's holder", func() bool {
		st, err := a.keyShared.Group("d/jobs/#")
		return err == nil && st.Holder != "" && st.Stats.Members == 1
	})
	pub := dialV5(t, a, &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte("poison")})
	m := w.Next(20 * time.Second)
	if m == nil || string(m.Payload) != "poison" {
		t.Fatalf("member got %+v", m)
	}
	if err := w.Nack(m, mqtttest.ReasonPayloadFormatInvalid); err != nil {
		t.Fatal(err)
	}
	if dl := watcher.Next(t); dl.Topic != "$dlq/d/jobs/x" || string(dl.Payload) != "poison" {
		t.Fatalf("live dead letter on the other node: %s %q", dl.Topic, dl.Payload)
	}
	base := "http://" + a.Addr("http")
	var page adminapi.DeadLetterPage
	waitFor(t, 10*time.Second, "the dead letter listed on the other node", func() bool {
		apiJSON(t, "GET", base+adminapi.PathDLQ+"?group=d%2Fjobs%2F%23", "", 200, &page)
		return len(page.DeadLetters) == 1
	})
	if dl := page.DeadLetters[0]; dl.ReasonCode != 0x99 || dl.Payload != "poison" {
		t.Fatalf("dead letter %+v", dl)
	}
	var res adminapi.ReplayResult
	apiJSON(t, "POST", base+adminapi.PathDLQReplay+"?group=d%2Fjobs%2F%23", "", 200, &res)
	if res.Count != 1 {
		t.Fatalf("replay: %+v", res)
	}
	m = w.Next(20 * time.Second)
	if m == nil || string(m.Payload) != "poison" {
		t.Fatalf("replayed message: %+v", m)
	}
	if err := w.Ack(m); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "no dead letter and the cursor at the head", func() bool {
		var v adminapi.GroupView
		apiJSON(t, "GET", "http://"+b.Addr("http")+adminapi.PathGroupDetail+"?group=d%2Fjobs%2F%23", "", 200, &v)
		return v.DeadLetters == 0 && v.Head == 2 && v.Cursor == 2 && v.Counters.DeadLettered == 1
	})
}

// TestClusterKeySharedBacklogLimit: a group's backlog limit holds across
// nodes: at the limit a publish on any node is refused with 0x97.
func TestClusterKeySharedBacklogLimit(t *testing.T) {
	nc := natstest.Start(t, 3)
	var bs []*Broker
	for i, u := range nc.URLs()[:2] {
		cfg := testConfig(t)
		cfg.Cluster.NATS = []string{u}
		cfg.Cluster.NodeID = fmt.Sprintf("node-%c", 'a'+i)
		cfg.GroupSettings.BacklogMaxMessages = 3
		bs = append(bs, startBroker(t, cfg))
	}
	w, err := mqtttest.DialWorker(bs[1].Addr("tcp"), "holder-of-nothing", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Disconnect() })
	if rc, err := w.Subscribe("$share/lim/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	// Node a learns of the group from its watch, milliseconds after the
	// SUBSCRIBE on node b; a publish before that is not the group's
	// (docs/cluster.md), and the backlog would count one message less.
	waitFor(t, 10*time.Second, "node a to open the group", func() bool { return bs[0].keyShared.IsOpen("lim/jobs/#") })
	pub := dialV5(t, bs[0], &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for i := range 4 {
		rc := pub.Publish(t, &paho.Publish{Topic: "jobs/x", QoS: 1, Payload: fmt.Appendf(nil, "m%d", i)})
		want := byte(0)
		if i == 3 {
			want = 0x97
		}
		if rc != want {
			t.Fatalf("publish %d: reason %#x, want %#x", i, rc, want)
		}
	}
}

// TestClusterResumedSessionKeepsOrder: 1,000 QoS 1 messages queued for an
// offline persistent session while a publisher on another node sends them
// (several seconds' worth) arrive in publish order when the client comes
// back: to the node that held the session, then, after another 1,000, to a
// third node that takes the session over (its outbox is rebuilt from
// KL_MSGS). Each delivery goes through the session's outbox, as on one
// node; mochi's in-flight path sent them sorted by their second.
func TestClusterResumedSessionKeepsOrder(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 3, nc.URLs())
	a, b, c := bs[0], bs[1], bs[2]
	const n = 1000
	dev := connectPersistent(t, a, "ordered", true)
	dev.Subscribe(t, paho.SubscribeOptions{Topic: "order/#", QoS: 1})
	dev.Close()
	pub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, b.Addr("tcp")), "order-pub", true, nil)
	check := func(node string, dev *client5, round int) {
		t.Helper()
		if !dev.Connack.SessionPresent {
			t.Fatalf("resumed on %s without session present", node)
		}
		for i := range n {
			m := dev.Next(t)
			if got := string(m.Payload); got != strconv.Itoa(i) {
				t.Fatalf("round %d on %s: message %d is %q (publish order lost)", round, node, i, got)
			}
		}
		expectNone(t, dev.V5, "ordered on "+node)
	}

	took := pub.PublishSeq(t, "order/x", 1, n)
	t.Logf("published %d QoS 1 messages in %v", n, took.Round(time.Millisecond))
	dev = connectPersistent(t, a, "ordered", false) // the node holding it
	check("node-a", dev, 1)
	dev.Close()

	pub.PublishSeq(t, "order/x", 1, n)
	dev = connectPersistent(t, c, "ordered", false) // a node taking it over
	check("node-c", dev, 2)
}
