package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// startClusterNode starts the keyline binary as a cluster node.
func startClusterNode(t *testing.T, id string, urls []string) *proc {
	t.Helper()
	return startKeyline(t, t.TempDir(), "--nats", strings.Join(urls, ","), "--node-id", id)
}

// receiver collects the payloads "<prefix><n>" a client receives.
type receiver struct {
	mu   sync.Mutex
	seen map[int]bool
	// first lists each number the first time it arrives, in arrival order.
	first []int
	dups  int
}

func newReceiver() *receiver { return &receiver{seen: map[int]bool{}} }

func (r *receiver) add(payload string) {
	i := strings.LastIndexByte(payload, '-')
	n, err := strconv.Atoi(payload[i+1:])
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[n] {
		r.dups++
		return
	}
	r.seen[n] = true
	r.first = append(r.first, n)
}

func (r *receiver) has(ns []int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range ns {
		if !r.seen[n] {
			return false
		}
	}
	return true
}

// check fails unless every number in acked arrived, first arrivals in order.
func (r *receiver) check(t *testing.T, who string, acked []int) {
	t.Helper()
	if !mqtttest.Within(30*time.Second, func() bool { return r.has(acked) }) {
		r.mu.Lock()
		var missing []int
		for _, n := range acked {
			if !r.seen[n] {
				missing = append(missing, n)
			}
		}
		r.mu.Unlock()
		t.Fatalf("%s: %d acknowledged messages never arrived: %v", who, len(missing), missing)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 1; i < len(r.first); i++ {
		if r.first[i] < r.first[i-1] {
			t.Fatalf("%s: message %d first arrived after %d (per-publisher order)", who, r.first[i], r.first[i-1])
		}
	}
	t.Logf("%s: %d messages, %d duplicates", who, len(r.first), r.dups)
}

// v5Session connects a persistent MQTT 5 session whose messages go to r.
func v5Session(t *testing.T, addr, id string, r *receiver) *paho.Client {
	t.Helper()
	r.mu.Lock()
	resuming := len(r.first) > 0
	r.mu.Unlock()
	expiry := uint32(3600)
	conn := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
	c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(p paho.PublishReceived) (bool, error) {
			r.add(string(p.Packet.Payload))
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
	if err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
	})
	if resuming && !ca.SessionPresent {
		t.Fatalf("%s resumed without session present", id)
	}
	return c
}

func subscribePaho(t *testing.T, c *paho.Client, filter string, qos byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}}); err != nil {
		t.Fatal(err)
	}
}

// publishAll publishes count QoS 1 messages "<prefix>-<i>" and returns the
// numbers that were acknowledged; hook runs before message i.
func publishAll(t *testing.T, pub *mqtttest.V5, topic, prefix string, count int, hook func(i int)) []int {
	t.Helper()
	var acked []int
	for i := range count {
		if hook != nil {
			hook(i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := pub.Client.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: fmt.Appendf(nil, "%s-%d", prefix, i)})
		cancel()
		if err == nil && res != nil && res.ReasonCode < 0x80 {
			acked = append(acked, i)
			continue
		}
		if res != nil {
			t.Logf("publish %d: reason %#x %s", i, res.ReasonCode, res.Properties.ReasonString)
		} else {
			t.Logf("publish %d: %v", i, err)
		}
	}
	return acked
}

// TestClusterSigkillNode kills a Keyline node holding persistent sessions,
// one connected and two offline (MQTT 5 and 3.1.1), while a publisher on
// another node goes on: every message acknowledged to the publisher reaches
// every session once its client reconnects to a third node.
func TestClusterSigkillNode(t *testing.T) {
	nc := natstest.Start(t, 3)
	urls := nc.URLs()
	a := startClusterNode(t, "node-a", urls[0:1])
	b := startClusterNode(t, "node-b", urls[1:2])
	c := startClusterNode(t, "node-c", urls[2:3])

	online, offline := newReceiver(), newReceiver()
	oc := v5Session(t, a.addrs["tcp"], "online-1", online)
	subscribePaho(t, oc, "jobs/#", 1)
	off := v5Session(t, a.addrs["tcp"], "offline-1", offline)
	subscribePaho(t, off, "jobs/#", 1)
	_ = off.Disconnect(&paho.Disconnect{})
	<-off.Done()
	v3url := mqtttest.V3URL(mqtttest.TCP, a.addrs["tcp"])
	v3 := mqtttest.ConnectV3(t, v3url, "v3-dev", false, nil)
	if qos := v3.Subscribe(t, "jobs/#", 1); qos != 1 {
		t.Fatalf("v3 SUBACK %#x", qos)
	}
	v3.Disconnect(0)

	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.addrs["tcp"], nil), &paho.Connect{ClientID: "publisher", CleanStart: true, KeepAlive: 30})
	const count = 200
	acked := publishAll(t, pub, "jobs/build", "job", count, func(i int) {
		if i == count/2 {
			if code := a.signal(t, syscall.SIGKILL); code != -1 {
				t.Fatalf("node a exit code %d, want -1 (killed)", code)
			}
		}
	})
	if len(acked) != count {
		t.Fatalf("%d of %d publishes acknowledged on a live node", len(acked), count)
	}

	// Every client reconnects to node c.
	v5Session(t, c.addrs["tcp"], "online-1", online)
	v5Session(t, c.addrs["tcp"], "offline-1", offline)
	online.check(t, "online-1", acked)
	offline.check(t, "offline-1", acked)

	v3r := newReceiver()
	v3 = mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, c.addrs["tcp"]), "v3-dev", false, nil)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case m := <-v3.Msgs:
				v3r.add(string(m.Payload()))
			case <-done:
				return
			}
		}
	}()
	v3r.check(t, "v3-dev", acked)
	close(done)
	<-stopped
	v3.Disconnect(0)
}

// TestClusterNATSServerKilled SIGKILLs one of three NATS servers while a
// publisher on one node sends QoS 1 messages to a subscriber on another:
// publishing goes on and every acknowledged message arrives.
func TestClusterNATSServerKilled(t *testing.T) {
	pc := natstest.StartProcs(t, 3)
	urls := pc.URLs()
	// Each node prefers a different server but knows them all.
	order := func(i int) []string { return append(append([]string{}, urls[i:]...), urls[:i]...) }
	a := startClusterNode(t, "node-a", order(0))
	startClusterNode(t, "node-b", order(1))
	c := startClusterNode(t, "node-c", order(2))

	got := newReceiver()
	sc := v5Session(t, c.addrs["tcp"], "sub-1", got)
	subscribePaho(t, sc, "load/#", 1)

	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, a.addrs["tcp"], nil), &paho.Connect{ClientID: "publisher", CleanStart: true, KeepAlive: 60})
	const count = 300
	var killedAt time.Time
	acked := publishAll(t, pub, "load/x", "m", count, func(i int) {
		if i == count/3 {
			// Kill the leader of the message stream: the worst case.
			leader := streamLeader(t, urls, "KL_MSGS")
			t.Logf("killing NATS server %s, leader of KL_MSGS", leader)
			pc.Kill(int(leader[1] - '1'))
			killedAt = time.Now()
		}
	})
	t.Logf("published %d of %d, the last %d after the kill (%v)", len(acked), count, count-count/3, time.Since(killedAt).Round(time.Millisecond))
	if len(acked) < count {
		t.Fatalf("only %d of %d publishes acknowledged: publishing did not go on", len(acked), count)
	}
	got.check(t, "sub-1", acked)
}

// TestClusterPipelinedNATSServerKilled kills the KL_MSGS leader while one
// publisher has 50 QoS 1 publishes in flight: its PUBACKs stay in publish
// order, publishing goes on after the election, and every acknowledged
// message arrives on another node in publish order (a store retried
// through the election never lands behind a later one).
func TestClusterPipelinedNATSServerKilled(t *testing.T) {
	pc := natstest.StartProcs(t, 3)
	urls := pc.URLs()
	order := func(i int) []string { return append(append([]string{}, urls[i:]...), urls[:i]...) }
	a := startClusterNode(t, "node-a", order(0))
	startClusterNode(t, "node-b", order(1))
	// The subscriber's node knows only a server that is not the stream's
	// leader: this test is about the publisher's stores through the
	// election (TestClusterNATSServerKilled lets nats.go pick the servers).
	// Its reader of KL_MSGS must still move its consumer off the killed
	// leader: before Node.orderedConsumer's MaxResetAttempts it got nothing for the
	// test's 30 s in 3 of 14 runs.
	leader := streamLeader(t, urls, "KL_MSGS")
	li := int(leader[1] - '1')
	c := startClusterNode(t, "node-c", []string{urls[(li+1)%len(urls)]})

	got := newReceiver()
	sc := v5Session(t, c.addrs["tcp"], "sub-1", got)
	subscribePaho(t, sc, "load/#", 1)

	pub := mqtttest.DialRawPublisher(t, a.addrs["tcp"], "publisher")
	const count, window = 1500, 50
	codes := pub.Pipelined(t, "load/x", count, window, func(i int) []byte { return fmt.Appendf(nil, "m-%d", i) }, func(i int) {
		if i == count/3 {
			if now := streamLeader(t, urls, "KL_MSGS"); now != leader {
				t.Fatalf("the KL_MSGS leader moved from %s to %s before the kill", leader, now)
			}
			t.Logf("killing NATS server %s, leader of KL_MSGS, with up to %d publishes in flight", leader, window)
			pc.Kill(li)
		}
	})
	var acked []int
	for i, code := range codes {
		if code < 0x80 {
			acked = append(acked, i)
		}
	}
	t.Logf("%d of %d acknowledged, %d refused (0x80)", len(acked), count, count-len(acked))
	if len(acked) == 0 || acked[len(acked)-1] < count-window {
		t.Fatalf("publishing did not go on after the kill: %d acknowledged", len(acked))
	}
	got.check(t, "sub-1", acked)
}

// streamLeader returns the server name ("n1".."n3") leading a stream.
func streamLeader(t *testing.T, urls []string, stream string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, done, err := openStream(ctx, urls, stream)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil || len(info.Cluster.Leader) != 2 {
		t.Fatalf("stream %s leader: %v %+v", stream, err, info)
	}
	return info.Cluster.Leader
}

// openStream connects to the NATS servers and opens a stream; done closes
// the connection.
func openStream(ctx context.Context, urls []string, stream string) (jetstream.Stream, func(), error) {
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err == nil {
		var st jetstream.Stream
		if st, err = js.Stream(ctx, stream); err == nil {
			return st, nc.Close, nil
		}
	}
	nc.Close()
	return nil, nil, err
}

// streamConsumers describes a stream's consumers as the NATS servers see
// them: name, the server leading it, what it delivered and has pending.
func streamConsumers(urls []string, stream string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, done, err := openStream(ctx, urls, stream)
	if err != nil {
		return err.Error()
	}
	defer done()
	var b strings.Builder
	if info, err := st.Info(ctx); err == nil && info.Cluster != nil {
		fmt.Fprintf(&b, "stream %s: last %d, leader %s, replicas", stream, info.State.LastSeq, info.Cluster.Leader)
		for _, p := range info.Cluster.Replicas {
			fmt.Fprintf(&b, " %s(current %v, offline %v)", p.Name, p.Current, p.Offline)
		}
	}
	l := st.ListConsumers(ctx)
	for ci := range l.Info() {
		leader := ""
		if ci.Cluster != nil {
			leader = ci.Cluster.Leader
		}
		fmt.Fprintf(&b, "; consumer %s on %q: delivered stream seq %d, pending %d, waiting %d",
			ci.Name, leader, ci.Delivered.Stream, ci.NumPending, ci.NumWaiting)
	}
	if err := l.Err(); err != nil {
		fmt.Fprintf(&b, "; listing: %v", err)
	}
	return b.String()
}
