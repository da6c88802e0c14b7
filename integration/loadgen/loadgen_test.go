package main

import (
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// TestTemplateDecodedByMochi patches publish templates as publishers do and
// has mochi decode them: the packet id and payload land where they belong.
func TestTemplateDecodedByMochi(t *testing.T) {
	for _, proto := range []byte{4, 5} {
		for qos := byte(0); qos <= 2; qos++ {
			key := ""
			if proto == 5 {
				key = "k42"
			}
			tm := newTmpl(proto, "bench/x", qos, key, 40)
			frame := slices.Clone(tm.frame)
			if qos > 0 {
				binary.BigEndian.PutUint16(frame[tm.pidOff:], 513)
			}
			want := payloadInfo{run: 9, pub: 3, ts: 12345, seq: 77, key: 42, keySeq: 5}
			putPayload(frame[tm.payOff:], want)

			h, err := mqttwire.ParseHeader(frame)
			if err != nil || h.Size+h.Remaining != len(frame) {
				t.Fatalf("proto %d qos %d: header %+v, %v; frame of %d bytes", proto, qos, h, err, len(frame))
			}
			pk := packets.Packet{ProtocolVersion: proto}
			if err := pk.FixedHeader.Decode(frame[0]); err != nil {
				t.Fatal(err)
			}
			pk.FixedHeader.Remaining = h.Remaining
			if err := pk.PublishDecode(frame[h.Size:]); err != nil {
				t.Fatalf("proto %d qos %d: mochi: %v", proto, qos, err)
			}
			if pk.TopicName != "bench/x" || pk.FixedHeader.Qos != qos || len(pk.Payload) != 40 {
				t.Fatalf("proto %d qos %d PUBLISH decoded as %q qos %d payload %d", proto, qos, pk.TopicName, pk.FixedHeader.Qos, len(pk.Payload))
			}
			if (qos > 0) != (tm.pidOff >= 0) || qos > 0 && pk.PacketID != 513 {
				t.Errorf("proto %d qos %d: packet id %d (offset %d)", proto, qos, pk.PacketID, tm.pidOff)
			}
			if proto == 5 && (len(pk.Properties.User) != 1 || pk.Properties.User[0].Key != "key" || pk.Properties.User[0].Val != "k42") {
				t.Errorf("user properties %+v", pk.Properties.User)
			}
			if got, ok := getPayload(pk.Payload); !ok || got != want {
				t.Errorf("proto %d qos %d: payload %+v", proto, qos, got)
			}
		}
	}
}

func TestHistogram(t *testing.T) {
	var h hist
	for v := int64(1); v <= 100000; v++ {
		h.record(v * 1000) // 1 µs .. 100 ms
	}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 50e6}, {0.9, 90e6}, {0.99, 99e6}} {
		got := float64(h.quantile(c.q))
		if got < c.want*0.99 || got > c.want*1.01 {
			t.Errorf("q%.2f = %.0f, want %.0f within 1%%", c.q, got, c.want)
		}
	}
	if h.quantile(1) != 100000*1000 || h.max != 100000*1000 {
		t.Errorf("max %d / q1 %d", h.max, h.quantile(1))
	}
	var o hist
	o.record(5)
	o.merge(&h)
	if o.n != h.n+1 || o.quantile(0) != 5 {
		t.Errorf("merge: n %d min %d", o.n, o.quantile(0))
	}
	for i := 128; i < 64*56; i++ { // up to values of 2^55 ns
		if histIndex(histValue(i)) != i {
			t.Fatalf("bucket %d: value %d maps to %d", i, histValue(i), histIndex(histValue(i)))
		}
	}
}

func TestOrderChecker(t *testing.T) {
	c := newOrderChecker(3, 70)
	// key 0 in order on consumer 0
	for s := uint32(1); s <= 100; s++ {
		if dup, viol := c.observe(0, s, 0); dup || viol {
			t.Fatalf("in-order seq %d flagged", s)
		}
	}
	// key 1: 1 2 4 3 3 5, seen by consumers 1 and 69
	var dups, viols int
	for i, s := range []uint32{1, 2, 4, 3, 3, 5} {
		dup, viol := c.observe(1, s, []int{1, 69}[i%2])
		if dup {
			dups++
		}
		if viol {
			viols++
		}
	}
	if dups != 1 || viols != 1 {
		t.Fatalf("key 1: %d duplicates, %d violations; want 1, 1", dups, viols)
	}
	// key 2: only seq 1 and 3 (2 missing); a huge sequence grows the bitset
	c.observe(2, 1, 2)
	c.observe(2, 3, 2)
	c.observe(2, 5000, 2)
	c.observe(7, 1, 0) // unknown key: ignored
	r := c.result(100 + 5 + 5000)
	if r.Unique != 100+5+3 || r.Duplicates != 1 || r.OrderViolations != 1 || r.KeysWithViolations != 1 {
		t.Errorf("result %+v", r)
	}
	if r.Missing != 5000-3 {
		t.Errorf("missing %d", r.Missing)
	}
	if r.KeysOnSeveralConsumers != 1 || r.KeysSeen != 3 || r.KeysPerConsumerMin != 0 || r.KeysPerConsumerMax != 1 {
		t.Errorf("spread %+v", r)
	}
}

// TestOrderCheckerCatchesRoundRobin simulates both dispatch policies with a
// deterministic interleaving of consumers that process at different speeds:
// sticky key-to-consumer dispatch (Key-Shared) keeps per-key order, a
// round-robin dispatch (mosquitto's $share) does not, and the checker says so.
func TestOrderCheckerCatchesRoundRobin(t *testing.T) {
	const keys, consumers, msgs = 16, 4, 4000
	simulate := func(pick func(i int, key uint32) int) orderJSON {
		c := newOrderChecker(keys, consumers)
		queues := make([][][2]uint32, consumers)
		seq := make([]uint32, keys)
		rng := uint64(88172645463325252)
		for i := 0; i < msgs; i++ {
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			k := uint32(rng % keys)
			seq[k]++
			q := pick(i, k)
			queues[q] = append(queues[q], [2]uint32{k, seq[k]})
		}
		// Consumer j processes j+1 messages per turn: unequal speeds.
		for done := false; !done; {
			done = true
			for j := range queues {
				for n := 0; n <= j && len(queues[j]) > 0; n++ {
					m := queues[j][0]
					queues[j] = queues[j][1:]
					c.observe(m[0], m[1], j)
				}
				if len(queues[j]) > 0 {
					done = false
				}
			}
		}
		return c.result(msgs)
	}
	sticky := simulate(func(_ int, k uint32) int { return int(k) % consumers })
	if sticky.OrderViolations != 0 || sticky.KeysOnSeveralConsumers != 0 || sticky.Missing != 0 {
		t.Errorf("sticky dispatch: %+v", sticky)
	}
	rr := simulate(func(i int, _ uint32) int { return i % consumers })
	if rr.OrderViolations == 0 || rr.KeysOnSeveralConsumers != keys || rr.Missing != 0 || rr.Duplicates != 0 {
		t.Errorf("round-robin dispatch: %+v", rr)
	}
}

func TestParseFlags(t *testing.T) {
	var errs strings.Builder
	for _, bad := range [][]string{
		{"-scenario", "nope"},
		{"-proto", "3"},
		{"-payload", "8"},
		{"-scenario", "shared", "-key-mode", "nope"},
		{"-scenario", "fanin", "-stalled", "2"},
		{"extra"},
		{"-addr", "127.0.0.1:1883,nohost"},
		{"-broker-pid", "12,x"},
		{"-drain-idle", "0s"},
	} {
		if _, err := parseFlags(bad, &errs); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	cfg, err := parseFlags([]string{"-scenario", "shared"}, &errs)
	if err != nil || cfg.qos != 1 || cfg.proto != 5 {
		t.Errorf("shared defaults: %+v %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"-scenario", "slowsub"}, &errs)
	if err != nil || cfg.stalled != 1 || cfg.qos != 0 {
		t.Errorf("slowsub defaults: %+v %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"-addr", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "-broker-pid", "7,8"}, &errs)
	if err != nil || len(cfg.addrs) != 3 || cfg.addrs[2] != "127.0.0.1:3" || cfg.brokerPID != 7 || len(cfg.brokerPIDs) != 2 {
		t.Errorf("lists: %+v %v", cfg, err)
	}
	r := newRun(cfg)
	if got := []string{r.subAddr(0), r.subAddr(1), r.subAddr(2)}; got[0] != cfg.addrs[1] || got[1] != cfg.addrs[2] || got[2] != cfg.addrs[0] {
		t.Errorf("subscribers connect to %v, want the nodes in turn from the second", got)
	}
}

// startMochi serves plain mochi on 127.0.0.1:0 for the test's lifetime.
//
// It stops mochi without Server.Close's sweep of the listener's clients:
// in mochi v2.7.9 that sweep (Clients.GetByListener) takes the clients'
// read lock twice, through Len, so a client leaving at that moment queues
// its Clients.Delete between the two and Close deadlocks for good
// (mochi-mqtt/server#488). A scenario's clients are often still leaving
// when the test ends. The cleanup does the sweep itself with a single read
// lock (Clients.GetAll), then unregisters the listener, so that Close only
// waits for the client goroutines and stops the hooks.
func startMochi(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := s.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Listeners.Close("t", func(string) {
			for _, cl := range s.Clients.GetAll() {
				s.DisconnectClient(cl, packets.ErrServerShuttingDown)
			}
		})
		s.Listeners.Delete("t")
		s.Close()
	})
	return ln.Addr().String()
}

func runArgs(t *testing.T, args ...string) *result {
	t.Helper()
	var errs strings.Builder
	cfg, err := parseFlags(args, &errs)
	if err != nil {
		t.Fatal(err)
	}
	res := runScenario(cfg, args)
	if !res.OK {
		t.Fatalf("%v: errors %v", args, res.Errors)
	}
	return res
}

func TestScenariosAgainstMochi(t *testing.T) {
	addr := startMochi(t)
	// Short windows, but a drain that waits out a loaded machine: the drain
	// ends early only after 3 s without a delivery.
	short := []string{"-addr", addr, "-warmup", "100ms", "-duration", "300ms", "-drain", "10s", "-drain-idle", "3s"}
	// Runs whose every message must arrive count messages instead of timing a
	// window: under -race on a loaded machine a 300 ms window can pass with
	// no publish in it at all (seen: "expected 0 delivered 0").
	counted := []string{"-addr", addr, "-duration", "30s", "-drain", "20s", "-drain-idle", "5s"}

	r := runArgs(t, append(counted, "-scenario", "fanout", "-subs", "3", "-topics", "2", "-pubs", "2", "-count", "300")...)
	if r.Expected == 0 || r.Delivered != r.Expected || r.Gaps != 0 || r.Reorders != 0 || r.Latency.Count != r.Delivered {
		t.Errorf("fanout: expected %d delivered %d gaps %d reorders %d latency count %d", r.Expected, r.Delivered, r.Gaps, r.Reorders, r.Latency.Count)
	}
	if r.CPU.Loadgen <= 0 {
		t.Errorf("fanout: no CPU measured: %+v", r.CPU)
	}

	r = runArgs(t, append(counted, "-scenario", "fanout", "-subs", "4", "-pubs", "2", "-count", "500", "-qos", "1")...)
	if r.PublishedAll != 1000 || r.Published != 1000 || r.Expected != 4000 || r.Delivered != 4000 || r.Gaps != 0 {
		t.Errorf("fanout -count: published %d/%d expected %d delivered %d gaps %d", r.Published, r.PublishedAll, r.Expected, r.Delivered, r.Gaps)
	}

	// Keep-alive pings (every second here) must not disturb a run. With a
	// keep-alive of 1 s, mochi closed subscribers whose pinger the loaded
	// machine held back past 1.5 s (seen: "subscriber 0: EOF"); 2 s leaves 3 s.
	r = runArgs(t, "-addr", addr, "-scenario", "fanout", "-subs", "2", "-qos", "1", "-keepalive", "2", "-rate", "2000", "-warmup", "0s", "-duration", "2500ms", "-drain", "10s", "-drain-idle", "3s")
	if r.Delivered != r.Expected || r.Expected == 0 {
		t.Errorf("fanout with keep-alive: expected %d delivered %d", r.Expected, r.Delivered)
	}

	// A count, not a duration: four round trips per QoS 2 message may not
	// fit a short window at all on a loaded machine (none did, once).
	r = runArgs(t, append(counted, "-scenario", "fanout", "-subs", "2", "-pubs", "1", "-qos", "2", "-proto", "4", "-count", "200")...)
	if r.Published != 200 || r.Expected != 400 || r.Delivered != r.Expected || r.PubNacks != 0 {
		t.Errorf("fanout qos 2: published %d expected %d delivered %d nacks %d", r.Published, r.Expected, r.Delivered, r.PubNacks)
	}

	for _, mode := range []string{"prop", "topic"} {
		r = runArgs(t, append(short, "-scenario", "shared", "-consumers", "3", "-keys", "10", "-key-mode", mode, "-pubs", "2")...)
		o := r.Order
		if o == nil || o.Missing != 0 || o.Duplicates != 0 || o.Unique != r.PublishedAll || o.KeysSeen != 10 || r.KeyPropMissing != 0 {
			t.Errorf("shared %s: %+v published %d key prop missing %d", mode, o, r.PublishedAll, r.KeyPropMissing)
		}
		if len(r.MsgsPerConsumer) != 3 {
			t.Errorf("shared %s: per consumer %v", mode, r.MsgsPerConsumer)
		}
	}

	// Several groups, their members spread over two addresses (one broker twice).
	r = runArgs(t, "-addr", addr+","+addr, "-warmup", "100ms", "-duration", "300ms", "-drain", "10s", "-drain-idle", "3s",
		"-scenario", "shared", "-groups", "3", "-consumers", "2", "-keys", "9", "-pubs", "2")
	if o := r.Order; o == nil || o.Missing != 0 || o.Duplicates != 0 || o.KeysSeen != 9 || len(r.MsgsPerConsumer) != 6 || r.Consumers != 6 {
		t.Errorf("shared -groups 3: %+v consumers %d per consumer %v", r.Order, r.Consumers, r.MsgsPerConsumer)
	}

	r = runArgs(t, append(short, "-scenario", "fanin", "-pubs", "5", "-subs", "2", "-group")...)
	if r.DeliveredAll != r.PublishedAll || r.PublishedAll == 0 {
		t.Errorf("fanin group: published %d delivered %d", r.PublishedAll, r.DeliveredAll)
	}

	r = runArgs(t, append(short, "-scenario", "slowsub", "-subs", "2", "-rate", "2000")...)
	if r.Stalled != 1 || r.DeliveredAll == 0 { // all, not the window's: a loaded machine can leave that empty
		t.Errorf("slowsub: %+v", r)
	}

	// The stalled reader reads once publishing stopped: mochi kept all of it.
	r = runArgs(t, append(short, "-scenario", "slowsub", "-subs", "2", "-rate", "2000", "-qos", "1")...)
	if st := r.Stall; st == nil || st.Published == 0 || st.Received != st.Published || st.Missing != 0 || st.FirstLossAfter != st.Published {
		t.Errorf("slowsub qos 1, the stalled reader once it read: %+v", r.Stall)
	}

	r = runArgs(t, "-addr", addr, "-scenario", "connections", "-conns", "50", "-settle", "0s")
	if c := r.Connections; c == nil || c.Opened != 50 || c.Alive != 50 || c.ConnectPerS <= 0 {
		t.Errorf("connections: %+v", r.Connections)
	}
}

func TestProbe(t *testing.T) {
	dir := t.TempDir()
	var out, errs strings.Builder
	if code := realMain([]string{"probe", "-dir", dir, "-n", "5", "-size", "512", "-round", "2"}, &out, &errs); code != 0 {
		t.Fatalf("probe exited %d: %s", code, errs.String())
	}
	var r probeResult
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	if !r.OK || r.Scenario != "probe" || r.Round != 2 || r.Fdatasync.Count != 5 || r.Fdatasync.P50 <= 0 || r.SyscallNS <= 0 || r.WriteBytes != 512 {
		t.Errorf("probe: %+v", r)
	}
	if want := 20 / (r.Fdatasync.P50 / 1e6); math.Abs(r.FsyncBound-want) > want/1000 {
		t.Errorf("fsync bound %v, want 20 / %v µs = %v", r.FsyncBound, r.Fdatasync.P50, want)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("probe left %d files in %s", len(left), dir)
	}
	if code := realMain([]string{"probe", "-dir", dir, "-n", "0"}, &out, &errs); code != 2 {
		t.Errorf("probe -n 0 exited %d, want 2", code)
	}
}

func TestPingNoBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var out, errs strings.Builder
	if code := realMain([]string{"ping", "-addr", addr, "-timeout", "300ms"}, &out, &errs); code != 1 {
		t.Fatalf("ping of a closed port exited %d: %s", code, errs.String())
	}
	if !strings.Contains(errs.String(), "no MQTT broker") {
		t.Errorf("stderr %q", errs.String())
	}
}

func TestNullBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nb := &nullBroker{topics: map[string][]*nullConn{}}
	done := make(chan struct{})
	go func() { nb.serve(ln); close(done) }()
	t.Cleanup(func() { ln.Close(); <-done })
	for _, proto := range []string{"4", "5"} {
		r := runArgs(t, "-addr", ln.Addr().String(), "-proto", proto, "-scenario", "fanout", "-subs", "5", "-topics", "2",
			"-warmup", "100ms", "-duration", "300ms", "-drain", "3s")
		if r.Expected == 0 || r.Delivered != r.Expected || r.Gaps != 0 || r.Reorders != 0 {
			t.Errorf("proto %s: expected %d delivered %d gaps %d reorders %d", proto, r.Expected, r.Delivered, r.Gaps, r.Reorders)
		}
	}
}
