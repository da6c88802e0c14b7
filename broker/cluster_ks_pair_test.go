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

// ksPair is a Key-Shared group on two nodes sharing one NATS server: member
// m1 on the first node, m2 on the node that does not hold the group's
// lease, and what they received (each payload is "<key> <seq>..."). Or, to
// compare, both members on one node without a cluster.
type ksPair struct {
	t             *testing.T
	bs            []*Broker
	cfgs          []Config
	group, filter string
	m1, m2        *mqtttest.Worker
	m2Node        *Broker
	got           map[string]string // payload -> member
	last          map[string]int    // key -> last seq received
	seq           int
	// check, when set, vets each delivery before it is taken.
	check func(who string, m *mqtttest.WorkerMessage)
}

// startKSPair starts the nodes with config (YAML, may be empty), and the
// members: m1 with o1, m2 with o2 (CleanStart and KeepAlive are set here).
func startKSPair(t *testing.T, config string, o1, o2 mqtttest.WorkerOptions) *ksPair {
	return startKSNodes(t, 2, config, o1, o2)
}

// startKSNodes is startKSPair on nodes nodes: 1 is one node, no cluster.
func startKSNodes(t *testing.T, nodes int, config string, o1, o2 mqtttest.WorkerOptions) *ksPair {
	p := &ksPair{t: t, group: "g/jobs/#", filter: "$share/g/jobs/#", got: map[string]string{}, last: map[string]int{}}
	var urls []string
	if nodes > 1 {
		urls = natstest.Start(t, 1).URLs()
	}
	for i := range nodes {
		cfg := testConfig(t)
		if err := DecodeConfig([]byte(config), &cfg); err != nil {
			t.Fatal(err)
		}
		if nodes > 1 {
			cfg.Cluster.NATS = urls
			cfg.Cluster.NodeID = fmt.Sprintf("node-%c", 'a'+i)
		}
		p.cfgs = append(p.cfgs, cfg)
		p.bs = append(p.bs, startBroker(t, cfg))
	}
	p.m1 = p.dial(p.bs[0], "m1", o1)
	waitFor(t, 15*time.Second, "the group", func() bool { h, n, _ := p.status(); return (h != "" || nodes == 1) && n == 1 })
	holder, _, _ := p.status()
	p.m2Node = p.bs[len(p.bs)-1]
	if holder == p.m2Node.cfg.Cluster.NodeID && nodes > 1 {
		p.m2Node = p.bs[0]
	}
	p.m2 = p.dial(p.m2Node, "m2", o2)
	waitFor(t, 15*time.Second, "both members active", func() bool { _, n, _ := p.status(); return n == 2 })
	if nodes > 1 {
		t.Logf("holder %s, m2 on %s", holder, p.m2Node.cfg.Cluster.NodeID)
	}
	return p
}

func (p *ksPair) dial(b *Broker, id string, o mqtttest.WorkerOptions) *mqtttest.Worker {
	p.t.Helper()
	o.CleanStart, o.KeepAlive = true, 30
	w, err := mqtttest.DialWorker(b.Addr("tcp"), id, o)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(w.Close)
	if rc, err := w.Subscribe(p.filter, 1); err != nil || rc != 1 {
		p.t.Fatalf("%s subscribe: %#x %v", id, rc, err)
	}
	return w
}

// status is the group's holder, active members and dead letters.
func (p *ksPair) status() (holder string, members int, dead uint64) {
	st, err := p.bs[0].keyShared.Group(p.group)
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

// publisher connects a publisher to the first node.
func (p *ksPair) publisher(o mqtttest.WorkerOptions) func(topic, key, pad string, qos byte) {
	o.CleanStart, o.KeepAlive = true, 30
	pub, err := mqtttest.DialWorker(p.bs[0].Addr("tcp"), "pub", o)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(pub.Close)
	return func(topic, key, pad string, qos byte) {
		p.t.Helper()
		p.seq++
		if rc, err := pub.Publish(topic, []byte(key+" "+strconv.Itoa(p.seq)+pad), qos, mqtttest.UserProperty{Key: "key", Value: key}); err != nil || rc >= 0x80 {
			p.t.Fatalf("publish: %#x %v", rc, err)
		}
	}
}

func (p *ksPair) take(who string, m *mqtttest.WorkerMessage, w *mqtttest.Worker) {
	p.t.Helper()
	if p.check != nil {
		p.check(who, m)
	}
	s := string(m.Payload)
	if was, dup := p.got[s]; dup {
		p.t.Fatalf("%.20q delivered twice (to %s, then %s)", s, was, who)
	}
	p.got[s] = who
	f := strings.Fields(s)
	key, n := f[0], f[1]
	seq, _ := strconv.Atoi(n)
	if seq <= p.last[key] {
		p.t.Fatalf("key %s out of order: %d after %d", key, seq, p.last[key])
	}
	p.last[key] = seq
	_ = w.Ack(m)
}

// receive takes deliveries until want in all were received; m1 may have
// left (only m2's are then taken).
func (p *ksPair) receive(want int, what string) {
	p.t.Helper()
	c1, c2 := p.m1.Messages(), p.m2.Messages()
	for len(p.got) < want {
		select {
		case m, ok := <-c1:
			if !ok {
				c1 = nil // m1 left
				continue
			}
			p.take("m1", m, p.m1)
		case m := <-c2:
			p.take("m2", m, p.m2)
		case <-time.After(mqtttest.Timeout):
			_, _, dead := p.status()
			p.t.Fatalf("%s: stalled after %d of %d messages (%d dead-lettered)", what, len(p.got), want, dead)
		}
	}
}

// byMember counts the deliveries of each member.
func (p *ksPair) byMember() map[string]int {
	out := map[string]int{}
	for _, who := range p.got {
		out[who]++
	}
	return out
}

func (p *ksPair) noDeadLetters(when string) {
	p.t.Helper()
	if _, _, dead := p.status(); dead != 0 {
		p.t.Fatalf("%s: %d messages dead-lettered", when, dead)
	}
}

// m1Leaves closes m1 and waits until the group has only m2.
func (p *ksPair) m1Leaves() {
	p.m1.Close()
	waitFor(p.t, 15*time.Second, "m1 gone from the group", func() bool { _, n, _ := p.status(); return n == 1 })
}

// waitUnroutable waits until keys keys wait for a member that can take them.
func (p *ksPair) waitUnroutable(keys int, what string) {
	waitFor(p.t, 15*time.Second, what, func() bool {
		st, err := p.bs[0].keyShared.Group(p.group)
		return err == nil && st.Stats.UnroutableKeys == keys
	})
}
