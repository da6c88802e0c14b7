package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/keyshared"
)

// appendAll appends n messages of one key to group gh through a, all at
// once, and returns their offsets in the order they were appended.
func appendAll(t *testing.T, a *appender, gh string, n int, tag string) []uint64 {
	t.Helper()
	offs := make([]uint64, n)
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		m := keyshared.Message{Key: "k", Topic: "orders/x", QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", tag, i), PublishedAt: time.Now()}
		a.append(gh, m.Key, "", keyshared.EncodeMessage(&m), func(off uint64, err error) {
			if err != nil {
				t.Error(err)
			}
			offs[i] = off
			wg.Done()
		})
	}
	wg.Wait()
	return offs
}

// checkStored fails unless offs are consecutive from the stream's first
// sequence, in the order appended, and the stream holds them once each
// with the payloads appended.
func checkStored(t *testing.T, s jetstream.Stream, offs []uint64, tag string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(offs)) {
		t.Fatalf("the stream holds %d messages, %d appended", info.State.Msgs, len(offs))
	}
	for i, off := range offs {
		if i > 0 && off != offs[i-1]+1 {
			t.Fatalf("offsets not in append order: %v", offs)
		}
		m, err := s.GetMsg(ctx, off)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := keyshared.DecodeMessage(m.Data, true)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%s:%d", tag, i); string(msg.Payload) != want {
			t.Fatalf("offset %d holds %q, want %q", off, msg.Payload, want)
		}
	}
}

// TestGroupAppendsBatch: the appends of a group waiting while one is in
// flight go to the stream as one atomic batch, stored once each, in the
// order they were made; a stream without atomic batches (made by an older
// release) is switched to them, and its appends are stored one by one
// meanwhile, in order.
func TestGroupAppendsBatch(t *testing.T) {
	nc := natstest.Start(t, 3)
	n, g := startGroupsNode(t, nc.URLs()[:1], "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range []string{"batch/a/#", "batch/b/#"} {
		if _, err := g.EnsureGroup(name, keyshared.GroupConfig{}); err != nil {
			t.Fatal(err)
		}
	}

	gh := groupHash("batch/a/#")
	s, err := n.js.Stream(ctx, groupStream(gh))
	if err != nil {
		t.Fatal(err)
	}
	offs := appendAll(t, g.appends, gh, 300, "a")
	checkStored(t, s, offs, "a")
	batched := 0
	for _, off := range offs {
		m, err := s.GetMsg(ctx, off)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(hdrBatchID) != "" {
			batched++
		}
	}
	if batched == 0 {
		t.Fatal("no append went in an atomic batch")
	}

	// A stream as an older release made it: no atomic batches.
	gh = groupHash("batch/b/#")
	s, err = n.js.Stream(ctx, groupStream(gh))
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowAtomicPublish = false
	if _, err := n.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	offs = appendAll(t, g.appends, gh, 300, "b")
	checkStored(t, s, offs, "b")
	eventually(t, 10*time.Second, "the stream to take atomic batches", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.Config.AllowAtomicPublish
	})
}

// TestGroupAppendBatchRetriedStoresOnce: a batch is retried message by
// message under the same ids. A batch stored whose answer was lost is
// answered again with the sequences it got; a batch one of whose messages
// was stored already is refused whole, and its retry stores each of them
// once, in order.
func TestGroupAppendBatchRetriedStoresOnce(t *testing.T) {
	nc := natstest.Start(t, 3)
	n, g := startGroupsNode(t, nc.URLs()[:1], "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const name = "retry/a/#"
	if _, err := g.EnsureGroup(name, keyshared.GroupConfig{}); err != nil {
		t.Fatal(err)
	}
	gh := groupHash(name)
	s, err := n.js.Stream(ctx, groupStream(gh))
	if err != nil {
		t.Fatal(err)
	}
	batch := func(tag string) []*appendReq {
		var b []*appendReq
		for i := range 20 {
			m := keyshared.Message{Key: "k", Topic: "retry/x", QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", tag, i)}
			b = append(b, &appendReq{gh: gh, id: fmt.Sprintf("%s-%d", tag, i), data: keyshared.EncodeMessage(&m), deadline: time.Now().Add(10 * time.Second)})
		}
		return b
	}
	retry := func(b []*appendReq) []uint64 {
		var offs []uint64
		for _, r := range b {
			off, err := g.appends.publish(r)
			if err != nil {
				t.Fatal(err)
			}
			offs = append(offs, off)
		}
		return offs
	}

	// Stored, its answer lost: the retry finds every message stored.
	// The stream's leader subscribes to its subject once it is elected, and
	// that interest reaches the server this node uses a moment later: until
	// then a commit has no responder and nothing of the batch is stored (the
	// broker's appends fall back to single publishes that retry; this test
	// drives publishBatch itself, so it waits here the same way).
	b := batch("lost")
	var offs []uint64
	eventually(t, 10*time.Second, "the group's stream to answer its subject", func() bool {
		offs, err = g.appends.publishBatch(gh, b)
		return !errors.Is(err, nats.ErrNoResponders)
	})
	if err != nil {
		t.Fatal(err)
	}
	if again := retry(b); fmt.Sprint(again) != fmt.Sprint(offs) {
		t.Fatalf("retry answered %v, the batch was stored at %v", again, offs)
	}
	checkStored(t, s, offs, "lost")

	// A batch whose commit comes late, after its retry stored the first
	// message: it stores nothing, and the retry stores the rest once each.
	b = batch("late")
	first, err := g.appends.publish(b[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.appends.publishBatch(gh, b); err == nil {
		t.Fatal("a batch holding a message stored already was stored")
	}
	again := retry(b)
	if again[0] != first {
		t.Fatalf("the message stored first was stored again: at %d and %d", first, again[0])
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 40 {
		t.Fatalf("the stream holds %d messages, want 40", info.State.Msgs)
	}
	for i := 1; i < len(again); i++ {
		if again[i] != again[i-1]+1 {
			t.Fatalf("the retry stored out of order: %v", again)
		}
	}
}

// TestAppendBatchesKeepKeyOrder: a group's batches in flight never share a
// key, and a key's appends leave in the order made, also when an append
// does not fit a batch and a later, smaller one of its key would.
func TestAppendBatchesKeepKeyOrder(t *testing.T) {
	a := newAppender(nil)
	q := &groupAppends{keys: map[string]bool{}}
	var made []*appendReq
	add := func(key string, size int) {
		r := &appendReq{key: key, data: make([]byte, size)}
		made = append(made, r)
		q.queue = append(q.queue, r)
	}
	add("a", 10)
	add("b", 10)
	add("a", maxAppendBatchBytes) // does not fit behind the first two
	add("a", 10)                  // must not overtake it
	add("c", 10)
	for i := range 3 * maxAppendBatch {
		add(fmt.Sprintf("k%d", i%7), 10)
	}
	var sent [][]*appendReq
	inFlight := map[int]bool{}
	for len(q.queue) > 0 || len(inFlight) > 0 {
		b, _ := a.nextLocked("g", q)
		if b != nil {
			for i := range inFlight {
				for _, r := range b {
					for _, o := range sent[i] {
						if o.key == r.key {
							t.Fatalf("key %s in two batches in flight", r.key)
						}
					}
				}
			}
			inFlight[len(sent)] = true
			sent = append(sent, b)
			if len(b) > maxAppendBatch {
				t.Fatalf("a batch of %d", len(b))
			}
			continue
		}
		if len(inFlight) == 0 {
			t.Fatal("appends wait with no batch in flight")
		}
		for i := range inFlight { // one of the batches in flight ends
			q.inFlight--
			for _, r := range sent[i] {
				delete(q.keys, r.key)
			}
			delete(inFlight, i)
			break
		}
	}
	order := map[string][]*appendReq{}
	for _, b := range sent {
		for _, r := range b {
			order[r.key] = append(order[r.key], r)
		}
	}
	want := map[string][]*appendReq{}
	for _, r := range made {
		want[r.key] = append(want[r.key], r)
	}
	for k, w := range want {
		got := order[k]
		if len(got) != len(w) {
			t.Fatalf("key %s: %d of %d appends sent", k, len(got), len(w))
		}
		for i := range w {
			if got[i] != w[i] {
				t.Fatalf("key %s: appends sent out of order", k)
			}
		}
	}
}
