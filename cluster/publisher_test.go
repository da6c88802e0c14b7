package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/internal/natstest"
)

// A publisher's stores are in flight together, their results come in the
// order of the Stores, and when the stream is gone for a while the stores
// that failed are retried only where no later one of the publisher can
// overtake them: the stream holds the stored ones in Store order, and none
// that was refused.
func TestPublisherKeepsOrderThroughFailures(t *testing.T) {
	nc := natstest.Start(t, 1)
	n, _ := startNodeCfg(t, Config{URLs: nc.URLs(), NodeID: "node-a", RequestTimeout: time.Second, PublishTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := n.js.Stream(ctx, StreamMessages)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config

	type result struct {
		i   int
		seq uint64
		err error
	}
	var mu sync.Mutex
	var results []result
	all := make(chan struct{})
	p := n.NewPublisher(nil)
	store := func(from, to int) {
		for i := from; i < to; i++ {
			p.Store("t/order", fmt.Appendf(nil, "m%d", i), func(seq uint64, err error) {
				mu.Lock()
				defer mu.Unlock()
				results = append(results, result{i, seq, err})
				if len(results) == 60 {
					close(all)
				}
			})
		}
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(results)
	}

	store(0, 20) // the stream is there: all stored, several in flight
	eventually(t, 20*time.Second, "the first stores", func() bool { return count() == 20 })
	if got := n.Stats.StoreWindowMax.Load(); got < 2 {
		t.Errorf("at most %d store in flight at once", got)
	}
	if err := n.js.DeleteStream(ctx, StreamMessages); err != nil {
		t.Fatal(err)
	}
	errsBefore := n.Stats.PublishErrors.Load()
	go store(20, 60) // may wait in Store while an earlier store is retried
	eventually(t, 20*time.Second, "a store to fail", func() bool {
		return n.Stats.PublishErrors.Load() > errsBefore || retrying(p)
	})
	if _, err := n.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatalf("only %d of 60 stores answered", count())
	}

	mu.Lock()
	defer mu.Unlock()
	var stored []string
	for k, r := range results {
		if r.i != k {
			t.Fatalf("result %d is store %d's: results out of Store order", k, r.i)
		}
		if r.err == nil && r.i >= 20 {
			stored = append(stored, fmt.Sprintf("m%d", r.i))
		}
	}
	if len(stored) == 0 {
		t.Fatal("no store succeeded once the stream was back")
	}
	cons, err := n.js.OrderedConsumer(ctx, StreamMessages, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// One more than it should hold: the fetch waits its 2 s (deliberately)
	// for a message that should not be there.
	batch, err := cons.Fetch(len(stored)+1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range batch.Messages() {
		got = append(got, string(m.Data()))
	}
	if fmt.Sprint(got) != fmt.Sprint(stored) {
		t.Fatalf("the stream holds %v, want the stored ones in Store order %v", got, stored)
	}
	t.Logf("%d of 40 stored after the stream came back; %d refused rather than retried behind a later one", len(stored), n.Stats.StoresNotRetried.Load())
	if len(stored) < 20 {
		t.Errorf("only %d of the 40 stores made while the stream was gone or after were stored: the failed ones were not retried in order", len(stored))
	}
}

// retrying reports whether p is retrying a store.
func retrying(p *Publisher) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.retrying
}
