package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

func TestMain(m *testing.M) {
	natstest.MaybeRunChild()
	goleak.VerifyTestMain(m)
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// recorder collects what a node's handler receives.
type recorder struct {
	mu       sync.Mutex
	msgs     []Incoming
	retained []string
	released []string
}

func (r *recorder) handler() Handler {
	return Handler{
		Message: func(m Incoming) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.msgs = append(r.msgs, m)
		},
		Retained: func(m Incoming) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.retained = append(r.retained, string(m.Data))
		},
		Release: func(id string, _ uint64) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.released = append(r.released, id)
		},
	}
}

func (r *recorder) bodies(queued bool) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		if m.Queued == queued {
			out = append(out, string(m.Data))
		}
	}
	return out
}

func (r *recorder) snapshot() (retained, released []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.retained), slices.Clone(r.released)
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	mqtttest.Eventually(t, d, what, cond)
}

func startNode(t *testing.T, urls []string, id string) (*Node, *recorder) {
	t.Helper()
	return startNodeCfg(t, Config{URLs: urls, NodeID: id})
}

func startNodeCfg(t *testing.T, cfg Config) (*Node, *recorder) {
	t.Helper()
	r := &recorder{}
	return startNodeWith(t, cfg, r.handler()), r
}

// startNodeWith starts a node calling h back, closed when the test ends.
func startNodeWith(t *testing.T, cfg Config, h Handler) *Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Logger = logger.With("node", cfg.NodeID)
	n, err := Start(ctx, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// warmCore publishes QoS 0 probes on topic from pub until sub's recorder
// has one: core interest reaches the other NATS servers asynchronously.
func warmCore(t *testing.T, pub *Node, r *recorder, topic string) {
	t.Helper()
	eventually(t, 10*time.Second, "core interest to propagate", func() bool {
		if _, err := pub.Publish(context.Background(), topic, 0, []byte("probe")); err != nil { // paced by the poll
			t.Fatal(err)
		}
		return slices.Contains(r.bodies(false), "probe")
	})
	// Drain: every probe sent so far arrives before a marker sent after them.
	if _, err := pub.Publish(context.Background(), topic, 0, []byte("marker")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the marker", func() bool { return slices.Contains(r.bodies(false), "marker") })
	r.mu.Lock()
	r.msgs = nil
	r.mu.Unlock()
}

func TestClusterNodes(t *testing.T) {
	nc := natstest.Start(t, 3)
	urls := nc.URLs()
	a, ra := startNode(t, urls[0:1], "node-a")
	b, rb := startNode(t, urls[1:2], "node-b")
	c, rc := startNode(t, urls[2:3], "node-c")
	if a.Replicas() != 3 {
		t.Fatalf("replicas %d, want 3", a.Replicas())
	}
	ctx := context.Background()
	for _, f := range []string{"a/#", "a/+", "a/b"} { // overlapping filters on one node
		if err := b.AddInterest(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.AddInterest(ctx, "x/#"); err != nil {
		t.Fatal(err)
	}

	t.Run("core: one copy per interested node, in order", func(t *testing.T) {
		warmCore(t, a, rb, "a/b")
		const n = 200
		for i := range n {
			if _, err := a.Publish(ctx, "a/b", 0, fmt.Appendf(nil, "m%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, 10*time.Second, "node b to receive", func() bool { return len(rb.bodies(false)) >= n })
		got := rb.bodies(false)
		for i, s := range got {
			if want := fmt.Sprintf("m%d", i); s != want {
				t.Fatalf("message %d is %q, want %q (duplicates or reordering)", i, s, want)
			}
		}
		if len(rc.bodies(false)) != 0 || len(ra.bodies(false)) != 0 {
			t.Fatalf("nodes without interest got messages: a %d, c %d", len(ra.bodies(false)), len(rc.bodies(false)))
		}
	})

	t.Run("queued: stored once, read by the interested node in order", func(t *testing.T) {
		const n = 100
		var last uint64
		for i := range n {
			seq, err := a.Publish(ctx, "a/q", 1, fmt.Appendf(nil, "q%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if seq <= last {
				t.Fatalf("sequence %d after %d", seq, last)
			}
			last = seq
		}
		eventually(t, 10*time.Second, "queued messages on node b", func() bool { return len(rb.bodies(true)) >= n })
		for i, s := range rb.bodies(true) {
			if want := fmt.Sprintf("q%d", i); s != want {
				t.Fatalf("queued message %d is %q, want %q", i, s, want)
			}
		}
		if got := len(rc.bodies(true)); got != 0 {
			t.Fatalf("node c without interest got %d queued messages", got)
		}
		if b.QueuedPosition() != last {
			t.Fatalf("node b position %d, want %d", b.QueuedPosition(), last)
		}
		// Removing the interest stops the flow.
		for _, f := range []string{"a/#", "a/+", "a/b"} {
			b.RemoveInterest(f)
		}
		if got := b.Filters(); len(got) != 0 {
			t.Fatalf("filters left: %q", got)
		}
	})

	t.Run("retained: a node started later loads them", func(t *testing.T) {
		if err := a.StoreRetained(ctx, "cfg/one", []byte("v1")); err != nil {
			t.Fatal(err)
		}
		if err := a.StoreRetained(ctx, "cfg/one", []byte("v2")); err != nil {
			t.Fatal(err)
		}
		if err := b.StoreRetained(ctx, "cfg/two", []byte("w1")); err != nil {
			t.Fatal(err)
		}
		// Node c follows the stream: it may skip v1 (replaced before it read
		// it), never v2.
		eventually(t, 10*time.Second, "retained on node c", func() bool {
			r, _ := rc.snapshot()
			return slices.Contains(r, "v2") && slices.Contains(r, "w1")
		})
		if r, _ := rc.snapshot(); slices.Index(r, "v1") > slices.Index(r, "v2") {
			t.Fatalf("node c applied v1 after v2: %q", r)
		}
		_, rd := startNode(t, urls[2:3], "node-d")
		got, _ := rd.snapshot()
		slices.Sort(got)
		if !slices.Equal(got, []string{"v2", "w1"}) {
			t.Fatalf("late node loaded %q, want the last value per topic", got)
		}
	})

	t.Run("sessions: release, announce", func(t *testing.T) {
		// The records' compare-and-set is the store contract's
		// (TestSessionStore); this is what nodes tell each other.
		const id = "dev.1 *>"
		if err := b.RequestRelease(ctx, "node-a", id, 7); err != nil {
			t.Fatal(err)
		}
		if _, rel := ra.snapshot(); !slices.Equal(rel, []string{id}) {
			t.Fatalf("node a released %q", rel)
		}
		if err := b.RequestRelease(ctx, "node-gone", id, 7); err != nil {
			t.Fatalf("release from a node that is gone: %v", err)
		}
		b.Announce(id, 8)
		eventually(t, 5*time.Second, "announcement on node c", func() bool {
			_, rel := rc.snapshot()
			return slices.Contains(rel, id)
		})
	})

	t.Run("replay: messages above a floor that the filters take", func(t *testing.T) {
		var seqs []uint64
		for i, topic := range []string{"r/1", "other/1", "r/2", "r/3/deep"} {
			seq, err := c.Publish(ctx, topic, 2, fmt.Appendf(nil, "r%d", i))
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, seq)
		}
		var got []string
		last, err := a.Replay(ctx, []string{"r/+", "r/#"}, seqs[0], func(_ uint64, body []byte) { got = append(got, string(body)) })
		if err != nil {
			t.Fatal(err)
		}
		if last < seqs[3] || !slices.Equal(got, []string{"r2", "r3"}) {
			t.Fatalf("replay got %q (last %d), want r2 r3", got, last)
		}
	})
}

func TestConsumerFilters(t *testing.T) {
	got := consumerFilters([]string{"kl.q.t.a.b", "kl.q.t.a.>", "kl.q.t.a", "kl.q.h.*", "kl.q.t.*.c", "kl.q.t.a.*", "kl.q.h.*"})
	want := []string{"kl.q.h.*", "kl.q.t.*.c", "kl.q.t.a", "kl.q.t.a.>"}
	if !slices.Equal(got, want) {
		t.Fatalf("consumerFilters = %q, want %q", got, want)
	}
	if got := consumerFilters(nil); len(got) != 1 || got[0] != "kl.q.t.~~" {
		t.Fatalf("empty interest: %q", got)
	}
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"a.>", "a.b", true}, {"a.>", "a", false}, {"a.*", "a.b", true}, {"a.*", "a.*", true},
		{"a.b", "a.*", false}, {"a.*", "a.>", false}, {">", "a", true}, {"a.*.c", "a.b.c", true}, {"a.*.c", "a.b.d", false},
	} {
		if got := subjectContains(c.a, c.b); got != c.want {
			t.Errorf("subjectContains(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

func TestReplicasCappedBySingleServer(t *testing.T) {
	nc := natstest.Start(t, 1)
	n, _ := startNode(t, nc.URLs(), "solo")
	if n.Replicas() != 1 {
		t.Fatalf("replicas %d on one server, want 1", n.Replicas())
	}
	if !n.Ready() {
		t.Fatal("node not ready")
	}
}
