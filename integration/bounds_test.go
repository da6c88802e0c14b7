package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// heapSample is a look at the broker's memory: heap in use after a forced GC
// (through --pprof), goroutines and RSS.
type heapSample struct {
	heap       uint64
	rssKB      uint64
	goroutines int
}

func sampleHeap(t *testing.T, p *proc) heapSample {
	t.Helper()
	var s heapSample
	base := "http://" + p.addrs["http"] + "/debug/pprof/"
	for line := range strings.SplitSeq(httpText(t, base+"heap?debug=1&gc=1"), "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			s.heap, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	first, _, _ := strings.Cut(httpText(t, base+"goroutine?debug=1"), "\n")
	s.goroutines, _ = strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			s.rssKB, _ = strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	if s.heap == 0 || s.goroutines == 0 || s.rssKB == 0 {
		t.Fatalf("could not read the broker's figures: %+v", s)
	}
	return s
}

func httpText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// TestTopicCachesHoldCopies: 300 QoS 0 publishes of 200 KB to distinct
// topics, matched by a group and an ordinary subscriber, once pinned 61 MB:
// the topic caches kept mochi's topic string, a view into the whole packet.
// After they are delivered the heap is back within a few MiB.
func TestTopicCachesHoldCopies(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof")
	addr := p.addrs["tcp"]
	member := dialWorker(t, addr, "member")
	subscribeWorker(t, member, "$share/g/big/#")
	sub := dialWorker(t, addr, "sub")
	if rc, err := sub.Subscribe("big/#", 0); err != nil || rc != 0 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	before := sampleHeap(t, p)
	pub := dialWorker(t, addr, "pub")
	payload := make([]byte, 200<<10)
	const n = 300
	for i := range n {
		if _, err := pub.Publish(fmt.Sprintf("big/%d", i), payload, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []*mqtttest.Worker{member, sub} {
		for i := range n {
			if w.Next(mqtttest.Timeout) == nil {
				t.Fatalf("%s got %d of %d", w.ClientID, i, n)
			}
		}
	}
	after := sampleHeap(t, p)
	t.Logf("heap %.1f MiB before, %.1f MiB after %d x 200 KB on distinct topics", mib(before.heap), mib(after.heap), n)
	if after.heap > before.heap+8<<20 {
		t.Fatalf("heap grew by %.1f MiB: the caches keep the packets", mib(after.heap-before.heap))
	}
}

// TestRoutingKeysAreBounded: a key past --max-key-size is refused with
// PUBACK 0x99 (MQTT 5), a disconnect (3.1.1, which cannot refuse), or a
// counted drop (QoS 0), and never reaches a member; a key at the limit goes.
func TestRoutingKeysAreBounded(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--max-key-size", "1KiB")
	addr := p.addrs["tcp"]
	member := dialWorker(t, addr, "member")
	subscribeWorker(t, member, "$share/g/jobs/#")
	pub := dialWorker(t, addr, "pub")
	long, limit := strings.Repeat("k", 1025), strings.Repeat("k", 1024)
	if rc, err := pub.Publish("jobs/a", []byte("long"), 1, mqtttest.UserProperty{Key: "key", Value: long}); err != nil || rc != 0x99 {
		t.Fatalf("QoS 1 with a 1,025-byte key: %#x %v, want 0x99", rc, err)
	}
	if _, err := pub.Publish("jobs/a", []byte("long-qos0"), 0, mqtttest.UserProperty{Key: "key", Value: long}); err != nil {
		t.Fatal(err)
	}
	if rc, err := pub.Publish("jobs/a", []byte("at-limit"), 1, mqtttest.UserProperty{Key: "key", Value: limit}); err != nil || rc != 0 {
		t.Fatalf("QoS 1 with a 1,024-byte key: %#x %v", rc, err)
	}
	if m := member.Next(mqtttest.Timeout); m == nil || string(m.Payload) != "at-limit" {
		t.Fatalf("the member got %+v, want only the message at the limit", m)
	}
	// MQTT 3.1.1: the topic is the key; a QoS 1 publish cannot be refused, so the client is cut.
	v3 := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
	if _, err := v3.Write(mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version311, ClientID: "old", CleanStart: true, KeepAlive: 30})); err != nil {
		t.Fatal(err)
	}
	topic := "jobs/" + strings.Repeat("t", 1100)
	if _, err := v3.Write(mqttwire.AppendPublish(nil, mqttwire.Version311, &mqttwire.Publish{Topic: topic, QoS: 1, PacketID: 1, Payload: []byte("x")})); err != nil {
		t.Fatal(err)
	}
	if !mqtttest.IsClosed(v3) {
		t.Fatal("the MQTT 3.1.1 publisher with a topic past max-key-size was not disconnected")
	}
	if got := p.metric(t, "keyline_keyshared_keys_too_long_total"); got != 3 {
		t.Fatalf("keys_too_long_total %v, want 3", got)
	}
}

// TestGroupsAreBounded: past --max-groups-per-client and --max-groups a
// SUBSCRIBE gets 0x97, more than 64 key filters get 0x8F, and a refused
// subscription leaves nothing behind (its group can be deleted).
func TestGroupsAreBounded(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--max-groups", "3", "--max-groups-per-client", "2")
	addr := p.addrs["tcp"]
	a := dialWorker(t, addr, "a")
	for _, c := range []struct {
		w      *mqtttest.Worker
		filter string
		want   byte
	}{
		{a, "$share/g1/x/#", 1},
		{a, "$share/g2/x/#", 1},
		{a, "$share/g3/x/#", 0x97}, // a's third group
	} {
		if rc, err := c.w.Subscribe(c.filter, 1); err != nil || rc != c.want {
			t.Fatalf("%s: SUBACK %#x %v, want %#x", c.filter, rc, err, c.want)
		}
	}
	b := dialWorker(t, addr, "b")
	if rc, err := b.Subscribe("$share/g3/x/#", 1); err != nil || rc != 1 {
		t.Fatalf("third group: %#x %v", rc, err)
	}
	if rc, err := b.Subscribe("$share/g4/x/#", 1); err != nil || rc != 0x97 {
		t.Fatalf("fourth group in a broker of at most 3: %#x %v, want 0x97", rc, err)
	}
	if rc, err := b.Subscribe("$share/g1/x/#", 1); err != nil || rc != 1 {
		t.Fatalf("joining an existing group: %#x %v", rc, err)
	}
	filters := make([]string, 65)
	for i := range filters {
		filters[i] = fmt.Sprintf("k%d-*", i)
	}
	c := dialWorker(t, addr, "c")
	if rc, err := c.Subscribe("$share/g2/x/#", 1, filters...); err != nil || rc != 0x8F {
		t.Fatalf("65 key filters: %#x %v, want 0x8F", rc, err)
	}
	a.Close()
	cliRun(t, p, "groups", "delete", "g2/x/#") // no phantom member holds it
	var gl adminapi.GroupList
	decodeJSON(t, cliRun(t, p, "groups", "list", "--json"), &gl)
	if len(gl.Groups) != 2 {
		t.Fatalf("%d groups left, want g1 and g3: %+v", len(gl.Groups), gl.Groups)
	}
}

// TestBacklogDoesNotFillMemory: a group with a 30 MB backlog and no member
// reads none of it, before and after a restart (a backlog once made keyline
// run out of memory while starting); a member that never acknowledges gets
// at most --window-bytes of it into memory.
func TestBacklogDoesNotFillMemory(t *testing.T) {
	dir := t.TempDir()
	p := startKeyline(t, dir, "--fsync=false", "--pprof", "--window-bytes", "4MiB")
	addr := p.addrs["tcp"]
	w := dialWorker(t, addr, "once")
	subscribeWorker(t, w, "$share/g/bulk/#")
	if rc, err := w.Unsubscribe("$share/g/bulk/#"); err != nil || rc != 0 {
		t.Fatalf("unsubscribe: %#x %v", rc, err)
	}
	base := sampleHeap(t, p)
	pub := dialWorker(t, addr, "pub")
	payload := make([]byte, 200<<10)
	for i := range 150 {
		publishKey(t, pub, "bulk/x", fmt.Sprint("k", i%10), string(payload[:len(payload)-len(fmt.Sprint(i))])+fmt.Sprint(i))
	}
	held := sampleHeap(t, p)
	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d after SIGKILL", code)
	}
	p = startKeyline(t, dir, "--fsync=false", "--pprof", "--window-bytes", "4MiB")
	restarted := sampleHeap(t, p)
	silent, err := mqtttest.DialWorker(p.addrs["tcp"], "silent", mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30, Buffer: 200})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(silent.Close)
	subscribeWorker(t, silent, "$share/g/bulk/#")
	if silent.Next(mqtttest.Timeout) == nil {
		t.Fatal("the member got nothing")
	}
	v := waitGroup(t, p, "g/bulk/#", "the window full", func(v adminapi.GroupView) bool { return v.InFlight > 0 && v.Lag > 0 })
	member := sampleHeap(t, p)
	t.Logf("heap: %.1f MiB idle, %.1f MiB holding a 30 MB backlog, %.1f MiB after a restart, %.1f MiB with a member (%d in flight, window %d bytes)",
		mib(base.heap), mib(held.heap), mib(restarted.heap), mib(member.heap), v.InFlight, v.WindowBytes)
	// While running, the log keeps its newest appends in a tail cache (8 MiB
	// per group, 64 MiB in all) to hand them to members without a read;
	// after a restart nothing of the backlog is in memory.
	if held.heap > base.heap+12<<20 || restarted.heap > base.heap+4<<20 {
		t.Fatalf("a backlog without members is in memory: %.1f MiB, %.1f MiB after a restart, against %.1f MiB idle",
			mib(held.heap), mib(restarted.heap), mib(base.heap))
	}
	if v.WindowBytes > 4<<20+256<<10 || member.heap > base.heap+16<<20 {
		t.Fatalf("window %d bytes, heap %.1f MiB: the window is not bounded by --window-bytes", v.WindowBytes, mib(member.heap))
	}
}

// TestLogsAreNoAmplifier: a malformed 100 KB packet, sent over and over on
// new connections, costs a few short log lines, not its size in log.
func TestLogsAreNoAmplifier(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--log-level", "debug")
	addr := p.addrs["tcp"]
	before := len(p.Logs())
	// A CONNECT, then a PUBLISH whose topic length runs past the packet: malformed.
	bad := []byte{0x30}
	bad = mqttwire.AppendVarint(bad, 100<<10)
	bad = append(bad, 0xff, 0xff)
	bad = append(bad, make([]byte, 100<<10-2)...)
	for i := range 30 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: "noisy", CleanStart: true, KeepAlive: 30})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(bad); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if !mqtttest.IsClosed(c) {
			t.Fatal("the connection stayed open after a malformed packet")
		}
		c.Close()
	}
	grown := len(p.Logs()) - before
	t.Logf("30 malformed packets of 100 KB: %d bytes of log", grown)
	if grown > 64<<10 {
		t.Fatalf("%d bytes of log for 30 malformed packets: the log amplifies", grown)
	}
}

func decodeJSON(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
}
