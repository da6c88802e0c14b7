package integration

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// openDevices opens n connections to addr, 64 at a time, each a device:
// CONNECT (MQTT 5, keep-alive 60 s) and one QoS 1 SUBSCRIBE to a topic of
// its own, both answered.
func openDevices(t *testing.T, addr, prefix string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				c, err := openDevice(addr, fmt.Sprintf("%s-%d", prefix, i))
				if err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
		t.Fatalf("opening %d devices: %v", n, err)
	}
	return conns
}

func openDevice(addr, id string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	frames := mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: id, CleanStart: true, KeepAlive: 60})
	frames = mqttwire.AppendSubscribe(frames, mqttwire.Version5, &mqttwire.Subscribe{PacketID: 1, Filters: []mqttwire.Subscription{{Filter: "dev/" + id + "/cmd", Options: 1}}})
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(frames); err != nil {
		c.Close()
		return nil, err
	}
	r := mqttwire.NewReader(c, 64)
	for _, want := range []byte{mqttwire.TypeConnack, mqttwire.TypeSuback} {
		pk, err := r.Next()
		if err != nil || pk.Type != want {
			c.Close()
			return nil, fmt.Errorf("%s: expected %s, got %s (%v)", id, mqttwire.TypeName(want), mqttwire.TypeName(pk.Type), err)
		}
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// TestSoakConnectionChurn opens and closes KEYLINE_SOAK_CONNS devices
// (default 2,000; BENCHMARKS.md reports 19,000) in rounds for KEYLINE_SOAK_CHURN
// (default 10s, at least 3 rounds): each round opens them all (CONNECT and one
// SUBSCRIBE each), then closes half with DISCONNECT and drops the other half,
// and waits until the broker has none left. RSS, heap and goroutines after the
// last round must be back where they were after the first: nothing a
// connection leaves behind accumulates. KEYLINE_SOAK_OUT names a CSV file for
// the samples (seconds, heap_mib, rss_mib, goroutines).
func TestSoakConnectionChurn(t *testing.T) {
	n, dur := 2000, 10*time.Second
	if v := os.Getenv("KEYLINE_SOAK_CONNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("KEYLINE_SOAK_CONNS=%q", v)
		}
	}
	if v := os.Getenv("KEYLINE_SOAK_CHURN"); v != "" {
		var err error
		if dur, err = time.ParseDuration(v); err != nil {
			t.Fatalf("KEYLINE_SOAK_CHURN: %v", err)
		}
	}
	// Every device connects from 127.0.0.1, thousands a second: past the
	// default connect-rate-per-address, which this test is not about.
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof", "--connect-rate-per-address", "0")
	addr := p.addrs["tcp"]
	start := time.Now()
	samples := []soakSample{sampleBroker(t, p, start)}
	var peak soakSample
	for round := 0; round < 3 || time.Since(start) < dur; round++ {
		conns := openDevices(t, addr, fmt.Sprintf("r%d", round), n)
		if s := sampleBroker(t, p, start); s.rssKB > peak.rssKB {
			peak = s
		}
		if got := p.metric(t, "keyline_clients_connected"); got != float64(n) {
			t.Fatalf("round %d: %v clients connected, want %d", round, got, n)
		}
		for i, c := range conns {
			if i%2 == 0 {
				_, _ = c.Write(mqttwire.AppendDisconnect(nil, 0))
			}
			_ = c.Close()
		}
		waitFor(t, "every device to be gone", func() bool { return p.metric(t, "keyline_clients_connected") == 0 })
		samples = append(samples, sampleBroker(t, p, start))
	}
	// Quiet: the broker returns what it freed once it has been quiet for a
	// while (memrelease.go looks every 10 s). Only /proc is read meanwhile:
	// the profile endpoints allocate, which is not quiet.
	back := samples[0].rssKB + (peak.rssKB-samples[0].rssKB)/4
	deadline := time.Now().Add(60 * time.Second)
	for rssOf(t, p) > back && time.Now().Before(deadline) {
		time.Sleep(time.Second) // deliberate: polling the broker's RSS while it is left alone
	}
	end := sampleBroker(t, p, start)
	if path := os.Getenv("KEYLINE_SOAK_OUT"); path != "" {
		out := "seconds,heap_mib,rss_mib,goroutines\n"
		for _, s := range append(samples, end) {
			out += fmt.Sprintf("%.3f,%.2f,%.2f,%d\n", s.at.Seconds(), mib(s.heap), float64(s.rssKB)/1024, s.goroutines)
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range samples {
		t.Logf("churn %8v  heap %6.1f MiB  rss %6.1f MiB  goroutines %d", s.at, mib(s.heap), float64(s.rssKB)/1024, s.goroutines)
	}
	t.Logf("churn peak with %d devices: rss %.1f MiB, heap %.1f MiB, goroutines %d", n, float64(peak.rssKB)/1024, mib(peak.heap), peak.goroutines)
	t.Logf("churn %8v  heap %6.1f MiB  rss %6.1f MiB  goroutines %d  (quiet, %d rounds of %d devices)", end.at, mib(end.heap), float64(end.rssKB)/1024, end.goroutines, len(samples)-1, n)

	first := samples[1] // after the first round: caches and pools have their size
	if end.goroutines > first.goroutines {
		t.Errorf("%d goroutines after the churn, %d after the first round", end.goroutines, first.goroutines)
	}
	if end.heap > uint64(1.1*float64(first.heap))+2<<20 {
		t.Errorf("heap %.1f MiB after the churn, %.1f MiB after the first round", mib(end.heap), mib(first.heap))
	}
	// RSS must not grow from round to round (the last third's median within
	// 10% + 8 MiB of the first third's), and once quiet it must come back to
	// within a quarter of what the devices took at their peak.
	rss := func(ss []soakSample) uint64 {
		v := make([]uint64, 0, len(ss))
		for _, s := range ss {
			v = append(v, s.rssKB)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	rounds := samples[1:]
	third := max(1, len(rounds)/3)
	if r0, r1 := rss(rounds[:third]), rss(rounds[len(rounds)-third:]); r1 > r0+r0/10+8<<10 {
		t.Errorf("RSS grows with churn: median %.1f MiB after the first rounds, %.1f MiB after the last", float64(r0)/1024, float64(r1)/1024)
	}
	if end.rssKB > back {
		t.Errorf("RSS %.1f MiB once quiet: not back to %.1f MiB (start %.1f MiB, peak %.1f MiB)", float64(end.rssKB)/1024, float64(back)/1024, float64(samples[0].rssKB)/1024, float64(peak.rssKB)/1024)
	}
}

// rssOf reads the broker's VmRSS from /proc, in KiB.
func rssOf(t *testing.T, p *proc) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
