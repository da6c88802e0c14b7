package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// Bridged throughput and backlog drain, Keyline beside mosquitto in the
// same run. The remote is mosquitto in every case; the edge that bridges to
// it is mosquitto, keyline (fsync on, its default) or keyline --fsync=false:
//
//	go test ./integration -run '^$' -bench Bridge -benchtime 1x -timeout 30m
//	KEYLINE_BRIDGE_BENCH_ROUNDS=3 go test ...   # three rounds, medians of the per-round ratios
//
// Both edges bridge bench/# out at QoS 1 over MQTT 3.1.1 with up to 1,000
// publishes in flight (mosquitto: max_inflight_messages 1000; keyline:
// max-inflight 1000) and an unbounded queue (mosquitto:
// max_queued_messages 0, in memory; keyline: the group log on disk). One
// publisher on the edge keeps 100 QoS 1 publishes in flight; one subscriber
// on the remote takes them at QoS 1. KEYLINE_BRIDGE_BENCH_N overrides the
// message counts (throughput 50,000, drain 100,000).

// benchCount is n, or KEYLINE_BRIDGE_BENCH_N when set.
func benchCount(n int) int {
	if v, err := strconv.Atoi(os.Getenv("KEYLINE_BRIDGE_BENCH_N")); err == nil && v > 0 {
		return v
	}
	return n
}

// sink is a persistent subscriber on the remote that times arrivals.
type sink struct {
	mu          sync.Mutex
	seen        map[string]bool
	first, last time.Time
	done        chan struct{}
	want        int
	cl          mqtt3.Client
}

func newSink(tb testing.TB, addr string, want int) *sink {
	tb.Helper()
	s := &sink{seen: map[string]bool{}, done: make(chan struct{}), want: want}
	o := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("sink").SetCleanSession(false).
		SetAutoReconnect(false).SetOrderMatters(false).SetConnectTimeout(mqtttest.Timeout).
		SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) {
			p := string(m.Payload())
			now := time.Now()
			s.mu.Lock()
			defer s.mu.Unlock()
			if p == "probe" || s.seen[p] {
				return
			}
			if len(s.seen) == 0 {
				s.first = now
			}
			s.seen[p] = true
			s.last = now
			if len(s.seen) == s.want {
				close(s.done)
			}
		})
	s.cl = mqtt3.NewClient(o)
	if tok := s.cl.Connect(); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
		tb.Fatalf("sink: %v", tok.Error())
	}
	if tok := s.cl.Subscribe("bench/#", 1, nil); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
		tb.Fatalf("sink subscribe: %v", tok.Error())
	}
	tb.Cleanup(func() { s.cl.Disconnect(0) })
	return s
}

func (s *sink) wait(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		s.mu.Lock()
		n := len(s.seen)
		s.mu.Unlock()
		tb.Fatalf("sink: %d of %d messages within %v", n, s.want, timeout)
	}
}

// benchEdge is an edge broker that bridges bench/# to the remote.
type benchEdge struct {
	name  string
	start func(tb testing.TB, remote string) edgeProc
}

// edgeProc is a started edge: its MQTT address, its process (0: none) and,
// for keyline, the bridge's queued messages.
type edgeProc struct {
	addr   string
	http   string // keyline's admin address
	pid    int
	queued func() uint64
}

// profileDrain writes a CPU profile of a keyline edge while it drains, to
// $KEYLINE_BRIDGE_BENCH_PROFILE.<edge> when that is set.
func profileDrain(tb testing.TB, name string, e edgeProc) (wait func()) {
	out := os.Getenv("KEYLINE_BRIDGE_BENCH_PROFILE")
	if out == "" || e.http == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get("http://" + e.http + "/debug/pprof/profile?seconds=5")
		if err != nil {
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(out + "." + name)
		if err != nil {
			return
		}
		defer f.Close()
		_, _ = io.Copy(f, resp.Body)
	}()
	return func() { <-done }
}

// cpuTime returns the CPU time (user + system) process pid has used; 0 for pid 0.
func cpuTime(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command (in parentheses): state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

var benchEdges = []benchEdge{
	// direct: no bridge, the publisher on the remote itself, the ceiling
	// these clients set on this machine.
	{"direct", func(_ testing.TB, remote string) edgeProc { return edgeProc{addr: remote} }},
	{"mosquitto", func(tb testing.TB, remote string) edgeProc {
		m := startMosquitto(tb, fmt.Sprintf(`max_inflight_messages 1000
connection central
address %s
topic bench/# out 1
bridge_protocol_version mqttv311
cleansession false
restart_timeout 1
`, remote))
		return edgeProc{addr: m.addr(), pid: m.cmd.Process.Pid}
	}},
	{"keyline", keylineEdge()},
	{"keyline-nofsync", keylineEdge("--fsync=false")},
}

func keylineEdge(extra ...string) func(tb testing.TB, remote string) edgeProc {
	return func(tb testing.TB, remote string) edgeProc {
		if os.Getenv("KEYLINE_BRIDGE_BENCH_PROFILE") != "" {
			extra = append(extra, "--pprof")
		}
		args := append([]string{"--bridge", "name=central address=" + remote +
			` client-id=edge protocol=3.1.1 reconnect-backoff=100ms,1s max-inflight=1000 topic="bench/# out 1"`}, extra...)
		p := startKeyline(tb, tb.TempDir(), args...)
		return edgeProc{addr: p.addrs["tcp"], http: p.addrs["http"], pid: p.cmd.Process.Pid, queued: func() uint64 { return bridgeStatus(tb, p, "central").QueuedMessages }}
	}
}

// publishN publishes n QoS 1 messages "0".."n-1" on bench/t with window in flight.
func publishN(tb testing.TB, addr string, n, window int) {
	tb.Helper()
	pub := mqtttest.ConnectV3(tb, "tcp://"+addr, "bench-pub", true, nil)
	defer pub.Disconnect(0)
	toks := make([]mqtt3.Token, 0, window)
	for i := range n {
		toks = append(toks, pub.Client.Publish("bench/t", 1, false, strconv.Itoa(i)))
		if len(toks) == window {
			if !toks[0].WaitTimeout(mqtttest.Timeout) || toks[0].Error() != nil {
				tb.Fatalf("publish: %v", toks[0].Error())
			}
			toks = toks[1:]
		}
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
			tb.Fatalf("publish: %v", tok.Error())
		}
	}
}

// probe publishes on the edge until the sink sees it: the bridge is up.
func probe(tb testing.TB, edge string, s *sink) {
	tb.Helper()
	pub := mqtttest.ConnectV3(tb, "tcp://"+edge, "bench-probe", true, nil)
	defer pub.Disconnect(0)
	got := make(chan struct{}, 1)
	tok := s.cl.Subscribe("bench/probe", 1, func(mqtt3.Client, mqtt3.Message) {
		select {
		case got <- struct{}{}:
		default:
		}
	})
	if !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
		tb.Fatalf("probe subscribe: %v", tok.Error())
	}
	deadline := time.After(mqtttest.Timeout)
	for {
		pub.Publish(tb, "bench/probe", 1, false, []byte("probe"))
		select {
		case <-got:
			s.cl.Unsubscribe("bench/probe").WaitTimeout(mqtttest.Timeout)
			return
		case <-deadline:
			tb.Fatal("the edge's bridge did not connect")
		case <-time.After(100 * time.Millisecond): // a probe interval while the bridge connects
		}
	}
}

// benchRounds is $KEYLINE_BRIDGE_BENCH_ROUNDS (default 1): every edge runs
// once per round, back to back, and the ratios are per round (medians
// reported).
func benchRounds() int {
	if v, err := strconv.Atoi(os.Getenv("KEYLINE_BRIDGE_BENCH_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return 1
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func BenchmarkBridgeThroughput(b *testing.B) {
	n := benchCount(50_000)
	var ratio, ratioNoSync, ofDirect []float64
	for range benchRounds() {
		rates := map[string]float64{}
		for _, e := range benchEdges {
			b.Run(e.name, func(b *testing.B) {
				remote := startMosquitto(b, "")
				s := newSink(b, remote.addr(), n)
				edge := e.start(b, remote.addr())
				if e.name != "direct" {
					probe(b, edge.addr, s)
				}
				cpu0, start := cpuTime(b, edge.pid), time.Now()
				publishN(b, edge.addr, n, 100)
				s.wait(b, 5*time.Minute)
				rates[e.name] = float64(n) / s.last.Sub(start).Seconds()
				b.ReportMetric(rates[e.name], "msgs/s")
				if edge.pid != 0 {
					b.ReportMetric(float64((cpuTime(b, edge.pid)-cpu0).Microseconds())/float64(n), "edge-cpu-µs/msg")
				}
			})
		}
		ratio = append(ratio, rates["keyline"]/rates["mosquitto"])
		ratioNoSync = append(ratioNoSync, rates["keyline-nofsync"]/rates["mosquitto"])
		ofDirect = append(ofDirect, rates["mosquitto"]/rates["direct"])
		b.Logf("round: %.0f / %.0f / %.0f / %.0f msgs/s (direct / mosquitto / keyline / keyline --fsync=false)",
			rates["direct"], rates["mosquitto"], rates["keyline"], rates["keyline-nofsync"])
	}
	b.Logf("bridged throughput, %d messages, median of %d rounds: keyline %.2fx mosquitto, keyline --fsync=false %.2fx; mosquitto %.2fx of direct",
		n, len(ratio), median(ratio), median(ratioNoSync), median(ofDirect))
}

func BenchmarkBridgeDrain(b *testing.B) {
	n := benchCount(100_000)
	var ratio, ratioNoSync []float64
	for range benchRounds() {
		drain := map[string]float64{}
		for _, e := range benchEdges[1:] {
			b.Run(e.name, func(b *testing.B) {
				remote := startMosquitto(b, "")
				s := newSink(b, remote.addr(), n)
				s.cl.Disconnect(0)              // the session stays, saved with the remote's state
				remote.stop(b, syscall.SIGTERM) // the uplink goes
				edge := e.start(b, remote.addr())
				start := time.Now()
				publishN(b, edge.addr, n, 100)
				b.ReportMetric(float64(n)/time.Since(start).Seconds(), "queued-msgs/s")
				if edge.queued != nil {
					if q := edge.queued(); q != uint64(n) {
						b.Fatalf("the edge holds %d messages, want %d", q, n)
					}
				}
				cpu0 := cpuTime(b, edge.pid)
				remote.start(b)
				profiled := profileDrain(b, e.name, edge)
				back := time.Now()
				if tok := s.cl.Connect(); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
					b.Fatalf("sink reconnect: %v", tok.Error())
				}
				s.wait(b, 10*time.Minute)
				profiled()
				drain[e.name] = s.last.Sub(s.first).Seconds()
				b.ReportMetric(float64((cpuTime(b, edge.pid)-cpu0).Microseconds())/float64(n), "edge-cpu-µs/msg")
				b.ReportMetric(s.last.Sub(back).Seconds(), "s-from-uplink")
				b.ReportMetric(drain[e.name], "s-first-to-last")
				b.ReportMetric(float64(n)/drain[e.name], "drain-msgs/s")
			})
		}
		ratio = append(ratio, drain["keyline"]/drain["mosquitto"])
		ratioNoSync = append(ratioNoSync, drain["keyline-nofsync"]/drain["mosquitto"])
		b.Logf("round: %.2f / %.2f / %.2f s first to last (mosquitto / keyline / keyline --fsync=false)",
			drain["mosquitto"], drain["keyline"], drain["keyline-nofsync"])
	}
	b.Logf("drain of %d messages, first to last, median of %d rounds: keyline %.2fx mosquitto's time, keyline --fsync=false %.2fx",
		n, len(ratio), median(ratio), median(ratioNoSync))
}
