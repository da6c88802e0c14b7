package broker

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// ksACLConfig: alice may read every topic, bob all of jobs/ but jobs/secret/.
const ksACLConfig = `
auth:
  auth:
    - {username: alice, password: apw, allow: true}
    - {username: bob, password: bpw, allow: true}
    - {username: pub, password: ppw, allow: true}
  acl:
    - username: bob
      filters:
        "jobs/secret/#": 0
        "jobs/#": 1
`

// TestClusterKeySharedReadAccessOfARemoteMember: a message that a member on
// another node than the group's holder may not read goes to a member that
// may, or waits for one, as on one node: never to that member, never to the
// dead letters.
func TestClusterKeySharedReadAccessOfARemoteMember(t *testing.T) {
	nc := natstest.Start(t, 1)
	var bs []*Broker
	var cfgs []Config
	for i := range 2 {
		cfg := testConfig(t)
		if err := DecodeConfig([]byte(ksACLConfig), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.Cluster.NATS = nc.URLs()
		cfg.Cluster.NodeID = fmt.Sprintf("node-%c", 'a'+i)
		cfgs = append(cfgs, cfg)
		bs = append(bs, startBroker(t, cfg))
	}
	const group, filter = "g/jobs/#", "$share/g/jobs/#"
	dial := func(b *Broker, id, user, pass string) *mqtttest.Worker {
		t.Helper()
		w, err := mqtttest.DialWorker(b.Addr("tcp"), id, mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30, Username: user, Password: pass})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		if rc, err := w.Subscribe(filter, 1); err != nil || rc != 1 {
			t.Fatalf("%s subscribe: %#x %v", id, rc, err)
		}
		return w
	}
	status := func() (holder string, members int, dead uint64) {
		st, err := bs[0].keyShared.Group(group)
		if err != nil {
			return "", 0, 0
		}
		active := 0
		for _, m := range st.Stats.PerMember {
			if m.Active {
				active++
			}
		}
		return st.Holder, active, st.Stats.DeadLettered
	}
	m1 := dial(bs[0], "m1", "alice", "apw")
	waitFor(t, 15*time.Second, "the group's holder", func() bool { h, n, _ := status(); return h != "" && n == 1 })
	holder, _, _ := status()
	// bob's member is on the node that does not hold the group.
	bobNode := bs[1]
	if holder == bs[1].cfg.Cluster.NodeID {
		bobNode = bs[0]
	}
	m2 := dial(bobNode, "m2", "bob", "bpw")
	waitFor(t, 15*time.Second, "both members active", func() bool { _, n, _ := status(); return n == 2 })
	t.Logf("holder %s, bob on %s", holder, bobNode.cfg.Cluster.NodeID)
	pub, err := mqtttest.DialWorker(bs[0].Addr("tcp"), "pub", mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30, Username: "pub", Password: "ppw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)

	seq := 0
	publishQoS := func(topic, key string, qos byte) {
		t.Helper()
		seq++
		if rc, err := pub.Publish(topic, []byte(key+" "+strconv.Itoa(seq)), qos, mqtttest.UserProperty{Key: "key", Value: key}); err != nil || rc >= 0x80 {
			t.Fatalf("publish: %#x %v", rc, err)
		}
	}
	publish := func(topic, key string) { t.Helper(); publishQoS(topic, key, 1) }
	got := map[string]string{} // payload -> member
	last := map[string]int{}   // key -> last seq received
	bobReadsSecret := false
	take := func(who string, m *mqtttest.WorkerMessage, w *mqtttest.Worker) {
		t.Helper()
		p := string(m.Payload)
		if who == "m2" && !bobReadsSecret && strings.HasPrefix(m.Topic, "jobs/secret/") {
			t.Fatalf("m2 (bob, may not read jobs/secret/#) got %s %q", m.Topic, p)
		}
		if was, dup := got[p]; dup {
			t.Fatalf("%q delivered twice (to %s, then %s)", p, was, who)
		}
		got[p] = who
		key, n, _ := strings.Cut(p, " ")
		s, _ := strconv.Atoi(n)
		if s <= last[key] {
			t.Fatalf("key %s out of order: %d after %d", key, s, last[key])
		}
		last[key] = s
		_ = w.Ack(m)
	}
	receive := func(want int, what string) {
		t.Helper()
		c1, c2 := m1.Messages(), m2.Messages()
		for len(got) < want {
			select {
			case m, ok := <-c1:
				if !ok {
					c1 = nil // m1 left
					continue
				}
				take("m1", m, m1)
			case m := <-c2:
				take("m2", m, m2)
			case <-time.After(mqtttest.Timeout):
				_, _, dead := status()
				t.Fatalf("%s: stalled after %d of %d messages (%d dead-lettered)", what, len(got), want, dead)
			}
		}
	}

	// Phase 1: both members connected; every key has messages each may
	// read and messages only m1 may.
	const keys, perKey = 20, 6
	for i := range perKey {
		for k := range keys {
			topic := "jobs/public/x"
			if (i+k)%2 == 0 {
				topic = "jobs/secret/x"
			}
			publish(topic, fmt.Sprintf("k%02d", k))
		}
	}
	receive(keys*perKey, "both members")
	byMember := map[string]int{}
	for _, who := range got {
		byMember[who]++
	}
	t.Logf("deliveries: %v", byMember)
	if byMember["m2"] == 0 {
		t.Fatalf("m2 got nothing: %v", byMember)
	}
	if _, _, dead := status(); dead != 0 {
		t.Fatalf("%d messages dead-lettered", dead)
	}

	// QoS 0 (routed, not logged): a message m2 may not read goes to m1.
	before0 := len(got)
	for k := range keys {
		publishQoS("jobs/secret/z", fmt.Sprintf("k%02d", k), 0)
	}
	receive(before0+keys, "QoS 0")

	// Phase 2: the only member that may read jobs/secret/ leaves; its
	// messages wait (m2's keep flowing) and go to it when it is back.
	m1.Close()
	waitFor(t, 15*time.Second, "m1 gone from the group", func() bool { _, n, _ := status(); return n == 1 })
	before := len(got)
	for k := range keys {
		publish("jobs/secret/y", fmt.Sprintf("k%02d", k))
	}
	for k := range keys {
		publish("jobs/public/y", fmt.Sprintf("p%02d", k)) // keys of their own: no secret message ahead of them
	}
	receive(before+keys, "m2 alone")
	waitFor(t, 15*time.Second, "the secret messages waiting for a member that may read them", func() bool {
		st, err := bs[0].keyShared.Group(group)
		return err == nil && st.Stats.UnroutableKeys == keys
	})
	if _, _, dead := status(); dead != 0 {
		t.Fatalf("%d messages dead-lettered while m1 was away", dead)
	}
	m1 = dial(bs[0], "m1", "alice", "apw")
	receive(before+2*keys, "m1 back")
	if _, _, dead := status(); dead != 0 {
		t.Fatalf("%d messages dead-lettered", dead)
	}

	// Phase 3: a reload lets bob read jobs/secret/ too: the topics the
	// holder learnt he may not read are his again.
	m1.Close()
	waitFor(t, 15*time.Second, "m1 gone from the group", func() bool { _, n, _ := status(); return n == 1 })
	for i, b := range bs {
		var fresh Config
		if err := DecodeConfig([]byte(strings.ReplaceAll(ksACLConfig, `"jobs/secret/#": 0`, `"jobs/secret/#": 1`)), &fresh); err != nil {
			t.Fatal(err)
		}
		c := cfgs[i]
		c.Auth = fresh.Auth
		b.SetReloadSource(func() (Config, error) { return c, nil })
		if res, err := b.Reload(); err != nil || len(res.NeedRestart) != 0 {
			t.Fatalf("reload: %+v %v", res, err)
		}
	}
	bobReadsSecret = true
	before = len(got)
	for k := range keys {
		publish("jobs/secret/y", fmt.Sprintf("k%02d", k))
	}
	c2 := m2.Messages()
	for len(got) < before+keys {
		select {
		case m := <-c2:
			take("m2", m, m2)
		case <-time.After(mqtttest.Timeout):
			_, _, dead := status()
			t.Fatalf("after the reload: m2 got %d of %d (%d dead-lettered)", len(got)-before, keys, dead)
		}
	}
	if _, _, dead := status(); dead != 0 {
		t.Fatalf("%d messages dead-lettered", dead)
	}
}
