package hooks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
)

// Fakes of what the cluster hook's parts depend on: no NATS, no mochi
// server.

// fakeNode is a cluster node: it records what the parts ask of it and
// answers from its fields.
type fakeNode struct {
	mu        sync.Mutex
	id        string
	position  uint64            // QueuedPosition
	last      uint64            // LastSequence
	seq       uint64            // the next KL_MSGS sequence Publish returns
	pubErr    error             // Publish fails with it
	published []string          // topics published
	stats     [][]byte          // PublishNodeStats
	alive     map[string]bool   // Alive
	aliveErr  map[string]error  // Alive fails for these
	asked     map[string]int    // Alive calls per node
	interest  map[string]int    // AddInterests - RemoveInterest per filter
	adds      int               // AddInterests calls
	storers   []*fakeStorer     // NewStorer
	releases  []string          // RequestRelease: "owner client rev"
	announced map[string]uint64 // Announce
}

func newFakeNode(id string) *fakeNode {
	return &fakeNode{id: id, seq: 1, alive: map[string]bool{}, aliveErr: map[string]error{}, asked: map[string]int{},
		interest: map[string]int{}, announced: map[string]uint64{}}
}

func (n *fakeNode) NodeID() string { return n.id }

func (n *fakeNode) Publish(_ context.Context, topic string, qos byte, _ []byte) (uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pubErr != nil {
		return 0, n.pubErr
	}
	n.published = append(n.published, topic)
	if qos == 0 {
		return 0, nil
	}
	n.seq++
	return n.seq - 1, nil
}

func (n *fakeNode) NewStorer(idle func()) storer {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := &fakeStorer{idle: idle}
	n.storers = append(n.storers, s)
	return s
}

func (n *fakeNode) QueuedPosition() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.position
}

func (n *fakeNode) LastSequence(context.Context) (uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last, nil
}

func (n *fakeNode) PublishNodeStats(data []byte) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stats = append(n.stats, data)
	return nil
}

func (n *fakeNode) Alive(_ context.Context, node string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.asked[node]++
	if err := n.aliveErr[node]; err != nil {
		return false, err
	}
	return n.alive[node], nil
}

func (n *fakeNode) AddInterests(_ context.Context, filters ...string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.adds++
	for _, f := range filters {
		n.interest[f]++
	}
	return nil
}

func (n *fakeNode) RemoveInterest(f string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.interest[f]--; n.interest[f] == 0 {
		delete(n.interest, f)
	}
}

// fakeStorer holds each Store's done until the test answers it, and is
// idle after each answer.
type fakeStorer struct {
	mu    sync.Mutex
	idle  func()
	dones []func(uint64, error)
}

func (s *fakeStorer) Store(_ string, _ []byte, done func(uint64, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dones = append(s.dones, done)
}

// answer answers the i-th Store.
func (s *fakeStorer) answer(i int, seq uint64, err error) {
	s.mu.Lock()
	done := s.dones[i]
	s.mu.Unlock()
	done(seq, err)
	if s.idle != nil {
		s.idle()
	}
}

// fakeInjector records the packets injected, and runs during, if set,
// while each is being injected.
type fakeInjector struct {
	mu     sync.Mutex
	got    []injected
	during func(pk packets.Packet)
}

type injected struct {
	cl *mqtt.Client
	pk packets.Packet
}

func (j *fakeInjector) InjectPacket(cl *mqtt.Client, pk packets.Packet) error {
	pk.Origin = cl.ID // as mochi's does
	if j.during != nil {
		j.during(pk)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.got = append(j.got, injected{cl, pk})
	return nil
}

func (j *fakeInjector) packets() []injected {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]injected(nil), j.got...)
}

func testLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// inlineClient is an inline client of id, as mochi's NewClient makes one.
func inlineClient(id string) *mqtt.Client {
	cl := &mqtt.Client{ID: id}
	cl.Net.Inline = true
	cl.Properties.ProtocolVersion = 5
	return cl
}

func newTestForwarder(n *fakeNode, j *fakeInjector) *forwarder {
	return &forwarder{node: n, inject: j, log: testLog, stats: &ClusterStats{},
		inlineCore: inlineClient(clusterCoreClient), inlineQueued: inlineClient(clusterQueuedClient)}
}

func testPublish(origin, topic string, qos byte) packets.Packet {
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos}, TopicName: topic,
		Payload: []byte("x"), Origin: origin}
	if qos > 0 {
		pk.PacketID = 1
	}
	return pk
}

// TestForwarderHoldsFloorsWhileStoring: a client's QoS 1 publish is
// deferred while it is stored; until then no floor passes the node's read
// position, once stored its sequence holds them until OnPublished, and
// the fan-out's reference for it is that sequence.
func TestForwarderHoldsFloorsWhileStoring(t *testing.T) {
	n, j := newFakeNode("a"), &fakeInjector{}
	f := newTestForwarder(n, j)
	cl := &mqtt.Client{ID: "pub"}
	cl.Properties.ProtocolVersion = 5
	n.position = 40
	pk := testPublish("pub", "a/b", 1)
	if _, err := f.publish(cl, pk); !errors.Is(err, mqtt.ErrPublishDeferred) {
		t.Fatalf("QoS 1 publish: %v, want it deferred", err)
	}
	if got := f.bound(100); got != 40 {
		t.Fatalf("floor bound while storing: %d, want 40 (the message goes above the read position)", got)
	}
	if f.ref(pk) != 0 {
		t.Fatal("a reference before the store answered")
	}
	n.storers[0].answer(0, 57, nil)
	if got := f.bound(100); got != 56 {
		t.Fatalf("floor bound once stored: %d, want 56", got)
	}
	if got := f.ref(pk); got != 57 {
		t.Fatalf("MessageRef: %d, want 57", got)
	}
	if f.stats.Forwarded.Load() != 1 {
		t.Fatalf("forwarded %d", f.stats.Forwarded.Load())
	}
	f.published(cl, testPublish("pub", "a/b", 0)) // a QoS 0 publish ending meanwhile
	if f.ref(pk) != 57 {
		t.Fatal("a QoS 0 publish cleared the QoS 1 publish's sequence")
	}
	f.published(cl, pk)
	if got := f.bound(100); got != 100 || f.ref(pk) != 0 {
		t.Fatalf("after OnPublished: bound %d, ref %d; want 100 and 0", got, f.ref(pk))
	}

	// A second publish of the client uses the same storer; a failed store
	// refuses it and releases the floor.
	if _, err := f.publish(cl, pk); !errors.Is(err, mqtt.ErrPublishDeferred) {
		t.Fatal(err)
	}
	if len(n.storers) != 1 {
		t.Fatalf("%d storers for one client", len(n.storers))
	}
	n.storers[0].answer(1, 0, errors.New("no JetStream"))
	if got := f.bound(100); got != 100 || f.stats.ForwardErrors.Load() != 1 {
		t.Fatalf("after a failed store: bound %d, errors %d", got, f.stats.ForwardErrors.Load())
	}
	f.disconnected(cl)
	if _, ok := f.publishers.Load(cl); ok {
		t.Fatal("a disconnected client's storer kept")
	}
}

// TestForwarderInline: what other nodes sent is not forwarded again; dead
// letters are, synchronously, and one that cannot be stored is refused; a
// QoS 0 publish that cannot be sent goes on locally.
func TestForwarderInline(t *testing.T) {
	n, j := newFakeNode("a"), &fakeInjector{}
	f := newTestForwarder(n, j)
	if _, err := f.publish(f.inlineQueued, testPublish(clusterQueuedClient, "a", 1)); err != nil || len(n.published) != 0 {
		t.Fatalf("a message from another node: %v, published %q", err, n.published)
	}
	dlq := inlineClient(dlqClientID)
	pk := testPublish(dlqClientID, "$dlq/g", 1)
	if _, err := f.publish(dlq, pk); err != nil || len(n.published) != 1 || f.ref(pk) != 1 {
		t.Fatalf("a dead letter: %v, published %q, ref %d", err, n.published, f.ref(pk))
	}
	f.published(dlq, pk)
	n.pubErr = errors.New("down")
	if _, err := f.publish(dlq, pk); !errors.Is(err, packets.ErrUnspecifiedError) {
		t.Fatalf("a dead letter not stored: %v, want 0x80", err)
	}
	cl := &mqtt.Client{ID: "c"}
	if _, err := f.publish(cl, testPublish("c", "a", 0)); err != nil || f.stats.ForwardErrors.Load() != 1 {
		t.Fatalf("QoS 0 not sent: %v, errors %d", err, f.stats.ForwardErrors.Load())
	}
}

// TestForwarderDeliver: a queued message from another node is injected by
// the queued client with its sequence as the reference (holding floors)
// while it is delivered, and only then; a core one by the core client; an
// expired or malformed one not at all.
func TestForwarderDeliver(t *testing.T) {
	n, j := newFakeNode("a"), &fakeInjector{}
	f := newTestForwarder(n, j)
	var during []uint64
	j.during = func(pk packets.Packet) { during = append(during, f.ref(pk), f.bound(1000)) }
	body, err := encodeEnvelope(testPublish("far", "t", 1))
	if err != nil {
		t.Fatal(err)
	}
	f.deliver(cluster.Incoming{Data: body, Queued: true, Seq: 300})
	f.deliver(cluster.Incoming{Data: body})
	old := testPublish("far", "t", 1)
	old.Expiry = time.Now().Add(-time.Minute).Unix()
	expired, _ := encodeEnvelope(old)
	f.deliver(cluster.Incoming{Data: expired, Queued: true, Seq: 301})
	f.deliver(cluster.Incoming{Data: []byte{9, 9}})
	got := j.packets()
	if len(got) != 2 || got[0].cl != f.inlineQueued || got[1].cl != f.inlineCore {
		t.Fatalf("injected %d packets, want the queued one then the core one", len(got))
	}
	if !got[0].pk.Mods.RetainNotStored {
		t.Fatal("a live copy may overwrite retained state")
	}
	if len(during) != 4 || during[0] != 300 || during[1] != 299 || during[2] != 0 || during[3] != 1000 {
		t.Fatalf("ref and bound while injecting: %v, want [300 299 0 1000]", during)
	}
	if f.bound(1000) != 1000 || f.stats.Expired.Load() != 1 || f.stats.Delivered.Load() != 2 {
		t.Fatalf("after: bound %d, expired %d, delivered %d", f.bound(1000), f.stats.Expired.Load(), f.stats.Delivered.Load())
	}
}
