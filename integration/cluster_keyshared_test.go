package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// Key-Shared groups across three keyline binaries on a three-server NATS
// cluster, checked with the single-node tests' ledger: zero order
// violations, zero overlapping deliveries of a key, zero missing.

const ksFilter = "$share/billing/orders/#"
const ksGroup = "billing/orders/#"

// startNodes starts n keyline nodes; node i knows every NATS server,
// preferring server i.
func startNodes(t *testing.T, n int, urls []string, extra ...string) []*proc {
	t.Helper()
	var out []*proc
	for i := range n {
		order := append(append([]string{}, urls[i%len(urls):]...), urls[:i%len(urls)]...)
		args := append([]string{"--nats", strings.Join(order, ","), "--node-id", fmt.Sprintf("node-%c", 'a'+i), "--fsync=false"}, extra...)
		out = append(out, startKeyline(t, t.TempDir(), args...))
	}
	return out
}

// keyedPublisher publishes "<key>:<seq>" QoS 1 messages keyed by key, and
// moves to another node when its node goes.
type keyedPublisher struct {
	id    string
	addrs func() []string
	pub   *mqtttest.V5
	moves int
}

func (p *keyedPublisher) connect(t *testing.T) error {
	var last error
	for _, addr := range p.addrs() {
		pub, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: p.id, CleanStart: true, KeepAlive: 30})
		if err == nil {
			p.pub = pub
			return nil
		}
		last = err
	}
	return fmt.Errorf("publisher %s: no node took it: %w", p.id, last)
}

// publish sends one message until a node acknowledges it. A message whose
// publish failed before any broker had it is sent again elsewhere.
func (p *keyedPublisher) publish(t *testing.T, key string, seq int) error {
	for attempt := 0; attempt < 5; attempt++ {
		if p.pub == nil {
			if err := p.connect(t); err != nil {
				return err
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		pr, err := p.pub.Client.Publish(ctx, &paho.Publish{Topic: "orders/" + key, QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", key, seq),
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
		cancel()
		if err == nil && pr.ReasonCode < 0x80 {
			return nil
		}
		if err == nil {
			return fmt.Errorf("publisher %s: %s:%d refused with %#x", p.id, key, seq, pr.ReasonCode)
		}
		p.pub.Close()
		p.pub, p.moves = nil, p.moves+1
	}
	return fmt.Errorf("publisher %s: %s:%d not acknowledged", p.id, key, seq)
}

// publishRounds publishes perKey rounds over keys from pubs publishers
// (publisher i owns keys i, i+pubs, ... and connects to node i of addrs()
// first); between(r) runs once round r-1 is acknowledged in full.
func publishRounds(t *testing.T, addrs func() []string, keys, perKey, pubs int, between func(round int)) []*keyedPublisher {
	t.Helper()
	ps := make([]*keyedPublisher, pubs)
	for i := range ps {
		i := i
		ps[i] = &keyedPublisher{id: fmt.Sprintf("pub-%d", i), addrs: func() []string {
			a := addrs()
			return append(append([]string{}, a[i%len(a):]...), a[:i%len(a)]...)
		}}
		if err := ps[i].connect(t); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, p := range ps {
			if p.pub != nil {
				p.pub.Close()
			}
		}
	})
	for s := range perKey {
		if between != nil {
			between(s)
		}
		var wg sync.WaitGroup
		errs := make(chan error, pubs)
		for i, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := i; k < keys; k += pubs {
					if err := p.publish(t, fmt.Sprintf("key-%04d", k), s); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	return ps
}

// spread counts the deliveries each member got.
func (l *ledger) spread() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, s := range l.byKey {
		for _, d := range s {
			out[d.member]++
		}
	}
	return out
}

// TestClusterKeySharedOrder: members and publishers on all three nodes,
// 300 keys x 30 messages: every message delivered once, each key in order,
// never two of a key out at once, and every member busy.
func TestClusterKeySharedOrder(t *testing.T) {
	const keys, perKey, pubs = 300, 30, 15
	nc := natstest.Start(t, 3)
	nodes := startNodes(t, 3, nc.URLs())
	addrs := func() []string { return []string{nodes[0].addrs["tcp"], nodes[1].addrs["tcp"], nodes[2].addrs["tcp"]} }
	l := newLedger()
	for i := range 6 {
		addMember(t, nodes[i%3].addrs["tcp"], fmt.Sprintf("m-%c-%d", 'a'+i%3, i/3), ksFilter, l)
	}
	v := waitGroup(t, nodes[1], ksGroup, "six members at the holder", func(v adminapi.GroupView) bool {
		return v.Holder != "" && len(v.PerMember) == 6
	})
	start := time.Now()
	publishRounds(t, addrs, keys, perKey, pubs, nil)
	l.waitComplete(t, keys, perKey, 2*time.Minute)
	elapsed := time.Since(start)
	if dups := l.check(t, keys, perKey, nil); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
	pairs := l.checkOverlaps(t)
	spread := l.spread()
	if len(spread) != 6 {
		t.Fatalf("deliveries reached %d of 6 members: %v", len(spread), spread)
	}
	t.Logf("%d messages, %d publishers and 6 members on 3 nodes, dispatcher on %s: %v (%.0f msgs/s end to end); %d key successions without overlap; per member %v",
		keys*perKey, pubs, v.Holder, elapsed.Round(time.Millisecond), float64(keys*perKey)/elapsed.Seconds(), pairs, spread)
}

// TestClusterKeySharedHolderSigkill: the node running the group's
// dispatcher is SIGKILLed mid-run. Its members reconnect to the other
// nodes (as new clients), its publishers too; the lease moves within
// seconds; nothing is missing, order holds, and only messages in flight at
// the dead node's members are delivered again.
func TestClusterKeySharedHolderSigkill(t *testing.T) {
	const keys, perKey, pubs = 300, 30, 15
	nc := natstest.Start(t, 3)
	nodes := startNodes(t, 3, nc.URLs())
	l := newLedger()
	members := map[string]*member{}
	for i := range 6 {
		id := fmt.Sprintf("m-%c-%d", 'a'+i%3, i/3)
		members[id] = addMember(t, nodes[i%3].addrs["tcp"], id, ksFilter, l)
	}
	v := waitGroup(t, nodes[0], ksGroup, "six members at the holder", func(v adminapi.GroupView) bool {
		return v.Holder != "" && len(v.PerMember) == 6
	})
	victim := int(v.Holder[len(v.Holder)-1] - 'a')
	alive := []int{}
	for i := range 3 {
		if i != victim {
			alive = append(alive, i)
		}
	}
	var mu sync.Mutex
	dead := false
	addrs := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for i, n := range nodes {
			if !dead || i != victim {
				out = append(out, n.addrs["tcp"])
			}
		}
		return out
	}
	departed := map[string]bool{}
	var killedAt time.Time
	var failover time.Duration
	publishRounds(t, addrs, keys, perKey, pubs, func(round int) {
		if round != perKey/3 {
			return
		}
		if code := nodes[victim].signal(t, syscall.SIGKILL); code != -1 {
			t.Fatalf("node %s exit code %d, want -1 (killed)", v.Holder, code)
		}
		killedAt = time.Now()
		mu.Lock()
		dead = true
		mu.Unlock()
		// Its members' connections are gone; they come back on the other
		// nodes as new clients (the ledger checks each identity's order).
		for id, m := range members {
			if id[2] == byte('a'+victim) {
				departed[id] = true
				<-m.c.Done()
				nid := id + "-again"
				addMember(t, nodes[alive[len(departed)%2]].addrs["tcp"], nid, ksFilter, l)
			}
		}
		nv := waitGroup(t, nodes[alive[0]], ksGroup, "the lease to move", func(v adminapi.GroupView) bool {
			return v.Holder != "" && v.Holder != fmt.Sprintf("node-%c", 'a'+victim) && len(v.PerMember) == 6
		})
		failover = time.Since(killedAt)
		t.Logf("node %s killed; the group is dispatched on %s after %v", v.Holder, nv.Holder, failover.Round(time.Millisecond))
	})
	l.waitComplete(t, keys, perKey, 2*time.Minute)
	dups := l.check(t, keys, perKey, departed)
	l.checkOverlaps(t)
	// Only what the dead node's members held can come again: at most
	// their in-flight window each (one message per key they owned).
	inflightBound := 0
	l.mu.Lock()
	for _, s := range l.byKey {
		for _, d := range s {
			if departed[d.member] {
				inflightBound++
				break
			}
		}
	}
	l.mu.Unlock()
	if dups > inflightBound {
		t.Fatalf("%d messages delivered twice; at most %d were in flight at the dead node's members", dups, inflightBound)
	}
	t.Logf("%d messages: %d delivered again (bound: %d keys the dead node's members had), failover %v", keys*perKey, dups, inflightBound, failover.Round(time.Millisecond))
}

// TestClusterKeySharedNATSServerKilled: one of the three NATS servers (the
// leader of the group's log) is SIGKILLed mid-run: publishing goes on,
// nothing is missing, order holds.
func TestClusterKeySharedNATSServerKilled(t *testing.T) {
	const keys, perKey, pubs = 300, 30, 15
	pc := natstest.StartProcs(t, 3)
	urls := pc.URLs()
	nodes := startNodes(t, 3, urls)
	addrs := func() []string { return []string{nodes[0].addrs["tcp"], nodes[1].addrs["tcp"], nodes[2].addrs["tcp"]} }
	l := newLedger()
	for i := range 6 {
		addMember(t, nodes[i%3].addrs["tcp"], fmt.Sprintf("m-%c-%d", 'a'+i%3, i/3), ksFilter, l)
	}
	waitGroup(t, nodes[0], ksGroup, "six members at the holder", func(v adminapi.GroupView) bool {
		return v.Holder != "" && len(v.PerMember) == 6
	})
	var killedAt time.Time
	l.describe = func() string {
		var b strings.Builder
		for _, n := range nodes {
			v := groupView(t, n, ksGroup)
			fmt.Fprintf(&b, "\n%s: holder %s running %v head %d cursor %d backlog %d lag %d in flight %d blocked %d members %v counters %+v",
				n.addrs["tcp"], v.Holder, v.Running, v.Head, v.Cursor, v.Backlog, v.Lag, v.InFlight, v.Blocked, v.Members, v.Counters)
		}
		b.WriteString("\n" + streamConsumers(urls, cluster.GroupStream(ksGroup)))
		// Where each node's goroutines are (Go prints them on SIGQUIT): the
		// logs below end with the dumps.
		for _, n := range nodes {
			_ = n.cmd.Process.Signal(syscall.SIGQUIT)
			<-n.done
		}
		return b.String()
	}
	publishRounds(t, addrs, keys, perKey, pubs, func(round int) {
		if round == perKey/3 {
			stream := cluster.GroupStream(ksGroup)
			leader := streamLeader(t, urls, stream)
			t.Logf("killing NATS server %s, leader of the group log %s", leader, stream)
			pc.Kill(int(leader[1] - '1'))
			killedAt = time.Now()
		}
	})
	t.Logf("published %d messages, the last %d after the kill (%v)", keys*perKey, keys*(perKey-perKey/3), time.Since(killedAt).Round(time.Millisecond))
	l.waitComplete(t, keys, perKey, 2*time.Minute)
	dups := l.check(t, keys, perKey, nil)
	l.checkOverlaps(t)
	t.Logf("all %d delivered in key order, %d twice", keys*perKey, dups)
}
