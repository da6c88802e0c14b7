// Package retainedtest is the contract suite of hooks.RetainedStore (the
// contract is written in hooks/retained.go): every implementation runs it,
// the data file's store (one node) and the cluster's KL_RETAINED over a
// real NATS cluster. A store that passes it can sit under the Retained hook.
package retainedtest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/hooks"
)

// Timeout bounds every wait of the suite.
const Timeout = 20 * time.Second

// Deployment opens the stores of one new, empty deployment.
type Deployment struct {
	// Open opens one more store applying through apply: in a cluster a new
	// node; on one node the store again, after Close of the one before, as
	// a restart does. Cleanup is registered with t.
	Open func(t *testing.T, apply func(packets.Packet)) hooks.RetainedStore
	// Close closes a store Open returned (one node: before the next Open);
	// nil: stores live until the test ends.
	Close func(t *testing.T, s hooks.RetainedStore)
	// Nodes is how many stores may be open at once (1: one node).
	Nodes int
}

// New returns a Deployment for one subtest.
type New func(t *testing.T) Deployment

// Run runs the contract against the deployments new returns, one per subtest.
func Run(t *testing.T, new New) {
	t.Run("Reopen", func(t *testing.T) { testReopen(t, new(t)) })
	t.Run("Expired", func(t *testing.T) { testExpired(t, new(t)) })
	t.Run("Follow", func(t *testing.T) { testFollow(t, new(t)) })
	t.Run("Converge", func(t *testing.T) { testConverge(t, new(t)) })
}

// index is a local retained index, as mochi's: what apply gave it and what
// its own publishes retained (mochi takes those before the hook stores them).
type index struct {
	mu      sync.Mutex
	msgs    map[string]packets.Packet
	applied map[string][]string // topic -> payloads applied, in order
}

func newIndex() *index {
	return &index{msgs: map[string]packets.Packet{}, applied: map[string][]string{}}
}

func (ix *index) apply(pk packets.Packet) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.applied[pk.TopicName] = append(ix.applied[pk.TopicName], string(pk.Payload))
	ix.setLocked(pk)
}

func (ix *index) setLocked(pk packets.Packet) {
	if len(pk.Payload) == 0 {
		delete(ix.msgs, pk.TopicName)
		return
	}
	ix.msgs[pk.TopicName] = pk.Copy(false)
}

func (ix *index) payloads() map[string]string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := map[string]string{}
	for t, pk := range ix.msgs {
		out[t] = string(pk.Payload)
	}
	return out
}

// node is one open store with its index.
type node struct {
	s  hooks.RetainedStore
	ix *index
}

func open(t *testing.T, d Deployment) *node {
	t.Helper()
	ix := newIndex()
	return &node{d.Open(t, ix.apply), ix}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return c
}

// retain publishes pk through n: its index takes it, then the store.
func (n *node) retain(t *testing.T, pk packets.Packet) {
	t.Helper()
	n.ix.mu.Lock()
	n.ix.setLocked(pk)
	n.ix.mu.Unlock()
	if err := n.s.Retain(ctx(t), pk); err != nil {
		t.Fatalf("Retain %q: %v", pk.TopicName, err)
	}
}

func (n *node) catchUp(t *testing.T) {
	t.Helper()
	if err := n.s.CatchUp(ctx(t)); err != nil {
		t.Fatalf("CatchUp: %v", err)
	}
}

func msg(topic, payload string) packets.Packet {
	return packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true, Qos: 1},
		TopicName:   topic, Payload: []byte(payload), Created: time.Now().Unix(), Origin: "pub",
		PacketID: 1, ProtocolVersion: 5,
	}
}

func closeStore(t *testing.T, d Deployment, n *node) {
	if d.Close != nil {
		d.Close(t, n.s)
	}
}

// testReopen: what a store holds is applied, as it was given, when the
// next store of the deployment opens: the last message per topic, no
// deleted topic, every property.
func testReopen(t *testing.T, d Deployment) {
	a := open(t, d)
	full := msg("cfg/é/deep/er", "v1")
	full.Properties = packets.Properties{
		PayloadFormat: 1, PayloadFormatFlag: true, MessageExpiryInterval: 3600, ContentType: "text/plain",
		ResponseTopic: "reply/here", CorrelationData: []byte{0, 1, 2},
		User: []packets.UserProperty{{Key: "k", Val: "v"}, {Key: "k", Val: "w"}},
	}
	full.Expiry = full.Created + 3600
	big := msg("big", strings.Repeat("x", 256<<10))
	big.FixedHeader.Qos = 0
	for _, pk := range []packets.Packet{msg("a/1", "v1"), msg("a/2", "v1"), msg("a/1", "v2"), full, big, msg("a/2", "")} {
		a.retain(t, pk)
	}
	closeStore(t, d, a)
	b := open(t, d)
	want := map[string]string{"a/1": "v2", "cfg/é/deep/er": "v1", "big": string(big.Payload)}
	if got := b.ix.payloads(); !maps.Equal(got, want) {
		t.Fatalf("opened with %d topics %v, want a/1=v2, cfg/é/deep/er=v1 and big", len(got), keys(got))
	}
	b.ix.mu.Lock()
	got, gbig := b.ix.msgs[full.TopicName], b.ix.msgs["big"]
	b.ix.mu.Unlock()
	if got.FixedHeader.Qos != 1 || gbig.FixedHeader.Qos != 0 {
		t.Errorf("QoS %d and %d, want 1 and 0", got.FixedHeader.Qos, gbig.FixedHeader.Qos)
	}
	p, w := got.Properties, full.Properties
	if p.PayloadFormat != w.PayloadFormat || !p.PayloadFormatFlag || p.MessageExpiryInterval != w.MessageExpiryInterval ||
		p.ContentType != w.ContentType || p.ResponseTopic != w.ResponseTopic || !bytes.Equal(p.CorrelationData, w.CorrelationData) ||
		!slices.Equal(p.User, w.User) {
		t.Errorf("properties %+v, want %+v", p, w)
	}
	if got.Created != full.Created {
		t.Errorf("created %d, want %d", got.Created, full.Created)
	}
}

// testExpired: a message past its expiry interval is not applied at the
// next opening, whether or not the index reported it expired.
func testExpired(t *testing.T, d Deployment) {
	a := open(t, d)
	for _, topic := range []string{"e/reported", "e/silent"} {
		pk := msg(topic, "old")
		pk.Created = time.Now().Unix() - 100
		pk.Properties.MessageExpiryInterval = 10
		pk.Expiry = pk.Created + 10
		a.retain(t, pk)
	}
	a.retain(t, msg("e/kept", "new"))
	a.s.Expired("e/reported")
	closeStore(t, d, a)
	b := open(t, d)
	if got := b.ix.payloads(); !maps.Equal(got, map[string]string{"e/kept": "new"}) {
		t.Fatalf("opened with %v, want only e/kept", got)
	}
}

// testFollow: an open store applies what another stores, in store order,
// deletions included, by the time CatchUp returns.
func testFollow(t *testing.T, d Deployment) {
	if d.Nodes < 2 {
		t.Skip("one store at a time: nothing else writes")
	}
	a, b := open(t, d), open(t, d)
	for i := range 20 {
		a.retain(t, msg("f/1", fmt.Sprint(i)))
	}
	a.retain(t, msg("f/2", "x"))
	a.retain(t, msg("f/2", ""))
	b.catchUp(t)
	if got := b.ix.payloads(); !maps.Equal(got, map[string]string{"f/1": "19"}) {
		t.Fatalf("after CatchUp the other store has %v, want f/1=19", got)
	}
	b.ix.mu.Lock()
	seq := b.ix.applied["f/1"]
	b.ix.mu.Unlock()
	last := -1
	for _, v := range seq {
		var n int
		fmt.Sscan(v, &n)
		if n < last {
			t.Fatalf("applied out of store order: %q", seq)
		}
		last = n
	}
}

// testConverge: stores writing one topic at once end with the same message.
func testConverge(t *testing.T, d Deployment) {
	if d.Nodes < 2 {
		t.Skip("one store at a time: nothing else writes")
	}
	nodes := []*node{open(t, d), open(t, d)}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 10 {
				pk := msg("c/1", fmt.Sprintf("n%d-%d", i, j))
				n.ix.mu.Lock()
				n.ix.setLocked(pk)
				n.ix.mu.Unlock()
				if err := n.s.Retain(context.Background(), pk); err != nil {
					t.Errorf("Retain: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, n := range nodes {
		n.catchUp(t)
	}
	a, b := nodes[0].ix.payloads()["c/1"], nodes[1].ix.payloads()["c/1"]
	if a != b || a == "" {
		t.Fatalf("stores ended with c/1 = %q and %q, want one message", a, b)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
