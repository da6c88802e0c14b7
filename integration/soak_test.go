package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// soakSample is one look at the broker between two rounds of churn.
type soakSample struct {
	at time.Duration
	heapSample
}

func sampleBroker(t *testing.T, p *proc, start time.Time) soakSample {
	t.Helper()
	return soakSample{at: time.Since(start).Round(time.Millisecond), heapSample: sampleHeap(t, p)}
}

// soakRound is one round of churn, every client new: a new Key-Shared group
// whose four members take 100 keyed messages, then two leave cleanly and two
// vanish; ten fan-out subscribers (QoS 0 and 1) that read 20 messages on
// topics never used before and leave; five persistent sessions (expiry 1 s)
// that subscribe and go, to expire.
func soakRound(t *testing.T, addr string, i int) {
	t.Helper()
	group := fmt.Sprintf("$share/soak%d/ks/%d/#", i, i)
	members := make([]*mqtttest.Worker, 4)
	for m := range members {
		members[m] = dialWorker(t, addr, fmt.Sprintf("s%d-member-%d", i, m))
		subscribeWorker(t, members[m], group)
	}
	var acked sync.WaitGroup
	const ksMessages = 100
	acked.Add(ksMessages)
	for _, w := range members {
		go func() {
			for m := range w.Messages() {
				if w.Ack(m) == nil {
					acked.Done()
				}
			}
		}()
	}
	pub := dialWorker(t, addr, fmt.Sprintf("s%d-pub", i))
	for n := range ksMessages {
		publishKey(t, pub, fmt.Sprintf("ks/%d/x", i), fmt.Sprintf("k%d", n%10), fmt.Sprint(n))
	}
	waitAll(t, &acked, "the group's messages acknowledged")
	members[0].Close()
	members[1].Close()
	members[2].Vanish()
	members[3].Vanish()

	subs := make([]*mqtttest.Worker, 10)
	for s := range subs {
		subs[s] = dialWorker(t, addr, fmt.Sprintf("s%d-sub-%d", i, s))
		if rc, err := subs[s].Subscribe(fmt.Sprintf("f/%d/#", i), byte(s%2)); err != nil || rc != byte(s%2) {
			t.Fatalf("subscribe: %#x %v", rc, err)
		}
	}
	for n := range 20 {
		if rc, err := pub.Publish(fmt.Sprintf("f/%d/%d", i, n), []byte("v"), 1); err != nil || rc != 0 {
			t.Fatalf("fan-out publish: %#x %v", rc, err)
		}
	}
	for _, s := range subs {
		for range 20 {
			m := s.Next(mqtttest.Timeout)
			if m == nil {
				t.Fatalf("%s: a fan-out message missing", s.ClientID)
			}
			if m.QoS > 0 {
				_ = s.Ack(m)
			}
		}
		s.Close()
	}
	for s := range 5 {
		w, err := mqtttest.DialWorker(addr, fmt.Sprintf("s%d-session-%d", i, s), mqtttest.WorkerOptions{CleanStart: true, SessionExpiry: 1, KeepAlive: 30})
		if err != nil {
			t.Fatal(err)
		}
		if rc, err := w.Subscribe(fmt.Sprintf("p/%d/%d", i, s), 1); err != nil || rc != 1 {
			t.Fatalf("session subscribe: %#x %v", rc, err)
		}
		w.Close()
	}
	pub.Close()
}

func waitAll(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestSoakStaysFlat runs rounds of client, group, topic and session churn
// against the binary and samples its heap (after a forced GC), RSS and
// goroutines between rounds. With no clients connected and the idle groups
// and sessions gone, the broker must be back within a small margin of where
// it stood after the first rounds: nothing it keeps grows with the number of
// clients, groups or topics that came and went. KEYLINE_SOAK sets how long
// the churn runs (default 10s; BENCHMARKS.md reports a 10-minute run),
// KEYLINE_SOAK_OUT a CSV file for the samples, KEYLINE_SOAK_HEAP a file for
// a heap profile taken after the churn.
func TestSoakStaysFlat(t *testing.T) {
	dur := 10 * time.Second
	if v := os.Getenv("KEYLINE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KEYLINE_SOAK: %v", err)
		}
		dur = d
	}
	// Every round's clients connect from 127.0.0.1, past the default
	// connect-rate-per-address (1,000 at once, then 100/s), which this test
	// is not about.
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof", "--group-idle-ttl", "1s", "--connect-rate-per-address", "0")
	addr := p.addrs["tcp"]
	start := time.Now()
	var samples []soakSample
	round := 0
	for ; time.Since(start) < dur || round < 6; round++ {
		soakRound(t, addr, round)
		samples = append(samples, sampleBroker(t, p, start))
	}
	// Quiet: every group idle past its TTL and deleted, every session expired.
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(time.Minute)
	for {
		groups := cliRun(t, p, "groups", "list", "--json")
		clients := httpText(t, "http://"+p.addrs["http"]+"/api/v1/clients")
		var cl adminapi.ClientList
		if err := json.Unmarshal([]byte(clients), &cl); err != nil {
			t.Fatalf("clients: %v", err)
		}
		if !strings.Contains(groups, `"name"`) && len(cl.Clients) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("groups or sessions left a minute after the churn:\n%s\n%s", groups, clients)
		}
		<-poll.C
	}
	end := sampleBroker(t, p, start)
	if path := os.Getenv("KEYLINE_SOAK_HEAP"); path != "" { // a heap profile of the broker after the churn, for pprof
		if err := os.WriteFile(path, []byte(httpText(t, "http://"+p.addrs["http"]+"/debug/pprof/heap?gc=1")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if path := os.Getenv("KEYLINE_SOAK_OUT"); path != "" { // the samples as CSV, for integration/bench/report -soak
		var b strings.Builder
		b.WriteString("seconds,heap_mib,rss_mib,goroutines\n")
		for _, s := range append(samples, end) {
			fmt.Fprintf(&b, "%.3f,%.2f,%.2f,%d\n", s.at.Seconds(), mib(s.heap), float64(s.rssKB)/1024, s.goroutines)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range samples {
		t.Logf("soak %8v  heap %6.1f MiB  rss %6.1f MiB  goroutines %d", s.at, mib(s.heap), float64(s.rssKB)/1024, s.goroutines)
	}
	t.Logf("soak %8v  heap %6.1f MiB  rss %6.1f MiB  goroutines %d  (after the churn, %d rounds, nothing left)", end.at, mib(end.heap), float64(end.rssKB)/1024, end.goroutines, round)

	third := len(samples) / 3
	first, last := samples[:third], samples[len(samples)-third:]
	med := func(ss []soakSample, f func(soakSample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	heap := func(s soakSample) float64 { return float64(s.heap) }
	// A margin of 10% plus 2 MiB: the heap of an idle broker is a few MiB,
	// and bounded caches (topics, routes) fill during the first rounds.
	if h0, h1 := med(first, heap), med(last, heap); h1 > 1.1*h0+2<<20 {
		t.Errorf("heap grows with churn: median %.1f MiB in the first third, %.1f MiB in the last", mib(uint64(h0)), mib(uint64(h1)))
	}
	if end.heap > uint64(1.1*med(first, heap))+2<<20 {
		t.Errorf("heap after the churn %.1f MiB, against %.1f MiB in the first rounds", mib(end.heap), mib(uint64(med(first, heap))))
	}
	if g0 := samples[0].goroutines; end.goroutines > g0 {
		t.Errorf("%d goroutines with nothing connected after the churn, %d after the first round", end.goroutines, g0)
	}
}
