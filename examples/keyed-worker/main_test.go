package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/broker"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// output collects what run prints and signals when a line containing want
// has been printed.
type output struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	if strings.Contains(o.buf.String(), o.want) {
		o.once.Do(func() { close(o.seen) })
	}
	return len(p), nil
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// startBroker starts an in-process broker (HTTP too) for the test.
func startBroker(t *testing.T) *broker.Broker {
	t.Helper()
	cfg := broker.DefaultConfig()
	cfg.TCP, cfg.HTTP, cfg.DataDir, cfg.Fsync, cfg.SegmentSize = "127.0.0.1:0", "127.0.0.1:0", t.TempDir(), false, 1<<20
	cfg.RetryBackoff = []time.Duration{100 * time.Millisecond}
	b, err := broker.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return b
}

type result struct {
	s   Summary
	err error
}

// startWorker runs the worker with args until it has subscribed; its
// result arrives on the channel.
func startWorker(t *testing.T, ctx context.Context, args ...string) (<-chan result, *output) {
	t.Helper()
	o, err := parseFlags(args, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	out := &output{want: "member of $share/", seen: make(chan struct{})}
	res := make(chan result, 1)
	go func() {
		s, err := run(ctx, o, out)
		res <- result{s, err}
	}()
	select {
	case <-out.seen:
	case r := <-res:
		t.Fatalf("worker ended before subscribing: %v\n%s", r.err, out)
	case <-ctx.Done():
		t.Fatalf("worker did not subscribe\n%s", out)
	}
	return res, out
}

// publishKeyed publishes perKey messages with sequence numbers 1.. for each
// of keys keys at qos.
func publishKeyed(t *testing.T, addr string, keys, perKey int, qos byte) {
	t.Helper()
	pub, err := mqtttest.DialWorker(addr, "pub", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for seq := 1; seq <= perKey; seq++ {
		for k := range keys {
			key := fmt.Sprintf("order-%d", k)
			rc, err := pub.Publish("jobs/new", fmt.Appendf(nil, `{"seq":%d}`, seq), qos, mqtttest.UserProperty{Key: "key", Value: key})
			if err != nil || rc != 0 {
				t.Fatalf("publish: 0x%02x %v", rc, err)
			}
		}
	}
}

// TestWorkerSmoke runs the worker against an in-process broker: it takes
// keyed messages, nacks every 3rd (the broker retries it), acks the rest,
// and finds every key in order.
func TestWorkerSmoke(t *testing.T) {
	b := startBroker(t)
	const keys, perKey = 3, 6
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, out := startWorker(t, ctx, "--broker", b.Addr("tcp"), "--group", "g", "--filter", "jobs/#", "--id", "w1",
		"--fail-every", "3", "--count", fmt.Sprint(keys*perKey), "--report", "0", "-v")
	publishKeyed(t, b.Addr("tcp"), keys, perKey, 1)
	var r result
	select {
	case r = <-res:
	case <-ctx.Done():
		t.Fatalf("worker did not ack %d messages\n%s", keys*perKey, out)
	}
	t.Logf("%s\n%s", r.s, out)
	s := r.s
	switch {
	case r.err != nil:
		t.Errorf("run: %v", r.err)
	case s.Acked != keys*perKey || s.Keys != keys:
		t.Errorf("acked %d messages of %d keys, want %d of %d", s.Acked, s.Keys, keys*perKey, keys)
	case s.Nacked == 0 || s.Retries != s.Nacked:
		t.Errorf("nacked %d, retries %d: want every nacked message back", s.Nacked, s.Retries)
	case s.Violations != 0 || s.Gaps != 0 || s.Duplicates != 0:
		t.Errorf("order violations %d, gaps %d, duplicates %d", s.Violations, s.Gaps, s.Duplicates)
	}
}

// TestWorkerRejectsAtQoS2: a worker subscribed at QoS 2 rejects every 4th
// message it processes (PUBREC 0x99): the broker dead-letters each at once
// and the key goes on; the rest complete (PUBREC, PUBREL, PUBCOMP).
func TestWorkerRejectsAtQoS2(t *testing.T) {
	b := startBroker(t)
	const keys, perKey = 2, 5 // the 10th message processed is an ack: --count is reached with it
	const rejected = keys * perKey / 4
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, out := startWorker(t, ctx, "--broker", b.Addr("tcp"), "--group", "g", "--filter", "jobs/#", "--id", "w2", "--qos", "2",
		"--reject-every", "4", "--count", fmt.Sprint(keys*perKey-rejected), "--report", "0", "-v")
	publishKeyed(t, b.Addr("tcp"), keys, perKey, 2)
	var r result
	select {
	case r = <-res:
	case <-ctx.Done():
		t.Fatalf("worker did not finish\n%s", out)
	}
	t.Logf("%s\n%s", r.s, out)
	if s := r.s; r.err != nil || s.Rejected != rejected || s.Acked != keys*perKey-rejected || s.Violations != 0 || s.Duplicates != 0 {
		t.Fatalf("run: %v; %s", r.err, s)
	}
	deadLetters := func() uint64 {
		resp, err := http.Get("http://" + b.Addr("http") + "/api/v1/groups/detail?group=" + url.QueryEscape("g/jobs/#"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var g struct {
			DeadLetters uint64 `json:"dead_letters"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&g); err != nil {
			t.Fatal(err)
		}
		return g.DeadLetters
	}
	// The broker records them as the answers arrive.
	poll.Until(t, mqtttest.Timeout, fmt.Sprintf("%d dead letters", rejected), func() bool { return deadLetters() == rejected })
}

func TestSeqOf(t *testing.T) {
	for in, want := range map[string]int64{`{"device":"d","seq":42}`: 42, "7": 7, " 8\n": 8} {
		if got, ok := seqOf([]byte(in)); !ok || got != want {
			t.Errorf("seqOf(%q) = %d, %v", in, got, ok)
		}
	}
	for _, in := range []string{`{"n":1}`, "x", ""} {
		if _, ok := seqOf([]byte(in)); ok {
			t.Errorf("seqOf(%q) found a sequence number", in)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--key-filter", "a*", "--key-filter", "b?"}, &bytes.Buffer{})
	if err != nil || len(o.keyFilters) != 2 || o.group != "workers" || o.filter != "telemetry/#" {
		t.Fatalf("%+v %v", o, err)
	}
	for _, args := range [][]string{{"--group", "a/b"}, {"--qos", "3"}, {"--concurrency", "0"}, {"extra"}} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestClassify drives one key's sequence checks through every verdict.
func TestClassify(t *testing.T) {
	var out bytes.Buffer
	wk := &worker{out: &out, keys: map[string]*keyState{}, done: make(chan struct{})}
	ks := &keyState{nacked: -1}
	const (
		ack    = ReasonSuccess
		nack   = ReasonUnspecifiedError
		reject = ReasonPayloadFormatInvalid
	)
	steps := []struct {
		seq    int64
		answer byte
		want   string
	}{
		{1, ack, "in-order"},
		{2, ack, "in-order"},
		{4, ack, "gap: 2 to 4"},          // 3 skipped
		{5, reject, "in-order"},          // dead-lettered here
		{6, nack, "in-order"},            // retried...
		{6, ack, "retry"},                // ...and acked
		{7, nack, "in-order"},            // nacked, then passed over: dead-lettered after its last attempt
		{8, ack, "in-order"},             // the key went on past 7
		{5, ack, "replayed dead letter"}, // keyline dlq replay
		{7, ack, "replayed dead letter"},
		{2, ack, "duplicate"},      // acked before: at-least-once
		{3, ack, "ORDER: after 8"}, // skipped by the gap, now behind 8
	}
	for i, st := range steps {
		got := wk.classify("k", ks, st.seq, "t")
		wk.record(ks, st.seq, true, st.answer)
		if got != st.want {
			t.Errorf("step %d: seq %d: %q, want %q", i, st.seq, got, st.want)
		}
	}
	s := wk.s
	if s.InOrder != 6 || s.Retries != 1 || s.Replays != 2 || s.Duplicates != 1 || s.Gaps != 1 || s.Violations != 1 {
		t.Errorf("%s", s)
	}
	if !strings.Contains(out.String(), "ORDER key=k seq=3") {
		t.Errorf("no ORDER line: %q", out.String())
	}
}
