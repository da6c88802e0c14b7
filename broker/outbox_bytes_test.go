package broker

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// publishBig publishes n QoS 1 messages of size bytes to topic, numbered.
func publishBig(t *testing.T, addr, topic string, n, size int) {
	t.Helper()
	pub, err := mqtttest.DialWorker(addr, "pub", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range n {
		payload := fmt.Sprintf("%05d|%s", i, strings.Repeat("x", size-6))
		if code, err := pub.Publish(topic, []byte(payload), 1); err != nil || code != 0 {
			t.Fatalf("publish %d: 0x%02x %v", i, code, err)
		}
	}
}

// leaveSession subscribes a persistent MQTT 5 session to filter at QoS 1
// and disconnects it.
func leaveSession(t *testing.T, addr, id, filter string) {
	t.Helper()
	c, _ := dialRaw(t, addr, id, rawOptions{version: 5, clean: true, sessionExpiry: 3600})
	c.subscribe(filter, 1)
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	c.c.Close()
}

// TestOfflineSessionQueueBoundedInBytes is issue 23's memory case 6 while
// the broker runs: 500 x 200 KB for one offline session pinned 98 MB (its
// bound was 8,192 x 1 MiB). With max-session-queue-bytes the session holds
// at most that; the rest is dropped, counted, and signalled to the client
// (which asked for the drop signal) when it comes back.
func TestOfflineSessionQueueBoundedInBytes(t *testing.T) {
	const n, size, bound = 300, 200 << 10, 16 << 20
	cfg := testConfig(t)
	cfg.LogLevel = LogInfo
	cfg.MaxSessionQueueBytes = bound
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	leaveSession(t, addr, "away", "q/#")
	before := heapInUse()
	publishBig(t, addr, "q/t", n, size)
	after := heapInUse()
	held, _, _ := b.fanout.Outbox("away", 0)
	dropped := b.fanout.OutboxStats.Dropped.Load()
	t.Logf("%d x %d KB for an offline session: heap %.1f MB before, %.1f MB after (bound %d MiB + 6 MiB); %d held, %d dropped",
		n, size>>10, float64(before)/1e6, float64(after)/1e6, bound>>20, held, dropped)
	if after > before+bound+6<<20 {
		t.Fatalf("heap grew by %.1f MB, bound %d MiB", float64(after-before)/1e6, bound>>20)
	}
	if held == 0 || uint64(held)+dropped != n || int64(held)*size > bound {
		t.Fatalf("held %d, dropped %d of %d", held, dropped, n)
	}
	// The client asked for the drop signal: the first message tells it.
	c, _ := dialRaw(t, addr, "away", rawOptions{version: 5, sessionExpiry: 3600,
		user: []packets.UserProperty{{Key: "drop-signal", Val: "1"}}})
	first := c.nextPublish()
	var signal string
	for _, u := range first.Properties.User {
		if u.Key == "dropped" {
			signal = u.Val
		}
	}
	if signal != strconv.FormatUint(dropped, 10) || !strings.HasPrefix(string(first.Payload), "00000|") {
		t.Fatalf("first message %.6q with dropped=%q, want %d", first.Payload, signal, dropped)
	}
}

// TestOfflineSessionsLoadLazily is issue 23's memory case 6 at start: the
// payloads queued for offline sessions stay on disk until their session
// resumes (they were all loaded, so start-up memory grew with what offline
// sessions held); then every message comes, in order.
func TestOfflineSessionsLoadLazily(t *testing.T) {
	const sessions, n, size = 4, 60, 200 << 10 // 48 MB queued
	cfg := testConfig(t)
	cfg.LogLevel = LogInfo
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	for s := range sessions {
		leaveSession(t, addr, fmt.Sprintf("away-%d", s), fmt.Sprintf("q/%d", s))
	}
	for s := range sessions {
		publishBig(t, addr, fmt.Sprintf("q/%d", s), n, size)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	before := heapInUse() // the first broker's sessions are still reachable: in both figures
	b2 := startBroker(t, cfg)
	after := heapInUse()
	queued, cold := b2.fanout.OutboxStats.Bytes.Load(), b2.fanout.OutboxStats.ColdBytes.Load()
	const bound = 8 << 20
	t.Logf("%d offline sessions holding %.1f MB on disk: heap %.1f MB before the start, %.1f MB after (bound %d MiB over before); %.1f MB cold",
		sessions, float64(queued)/1e6, float64(before)/1e6, float64(after)/1e6, bound>>20, float64(cold)/1e6)
	if cold != queued || queued < sessions*n*size {
		t.Fatalf("queued %d bytes, cold %d", queued, cold)
	}
	if after > before+bound {
		t.Fatalf("start-up heap grew by %.1f MB with %.1f MB queued on disk", float64(after-before)/1e6, float64(queued)/1e6)
	}
	c, _ := dialRaw(t, b2.Addr("tcp"), "away-2", rawOptions{version: 5, sessionExpiry: 3600})
	for i := range n {
		pk := c.nextPublish()
		if want := fmt.Sprintf("%05d|", i); !strings.HasPrefix(string(pk.Payload), want) {
			t.Fatalf("message %d is %.6q", i, pk.Payload)
		}
		c.ack(pk)
	}
	if cold := b2.fanout.OutboxStats.ColdBytes.Load(); cold >= queued {
		t.Fatalf("cold bytes %d after a session resumed", cold)
	}
}

// TestStalledReaderBacklogSpills is issue 27's stalled QoS 1 reader: a
// connected client that stops reading while its session is sent 6 MB keeps
// only spill-after (plus what its connection queue holds) of it in the heap,
// and once it reads again it gets every message, in order. A clean
// session's backlog waits in data-dir/spill, which holds nothing after; a
// persistent session's is in the session store already: its frames are let
// go once stored and read back from there, nothing is written to the spill.
func TestStalledReaderBacklogSpills(t *testing.T) {
	for _, persistent := range []bool{false, true} {
		t.Run(map[bool]string{false: "clean", true: "persistent"}[persistent], func(t *testing.T) {
			testStalledReaderBacklog(t, persistent)
		})
	}
}

func testStalledReaderBacklog(t *testing.T, persistent bool) {
	const n, size = 300, 20 << 10
	cfg := testConfig(t)
	cfg.LogLevel = LogInfo
	cfg.SpillAfter = 256 << 10
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	o := rawOptions{version: 5, clean: true, rcvbuf: 4096}
	if persistent {
		o.sessionExpiry = 3600
	}
	c, _ := dialRaw(t, addr, "stalled", o)
	c.subscribe("s/#", 1)
	before := heapInUse()
	publishBig(t, addr, "s/t", n, size)
	after := heapInUse()
	sp, stats := b.fanout.Spill(), &b.fanout.OutboxStats
	t.Logf("%d x %d KB for a client that does not read: heap %.1f MB before, %.1f MB after; %d messages spilled, %.1f MB in the spill, %d cold (%.1f MB)",
		n, size>>10, float64(before)/1e6, float64(after)/1e6, sp.Spilled.Load(), float64(sp.Bytes.Load())/1e6, sp.Cooled.Load(), float64(stats.ColdBytes.Load())/1e6)
	// What stays in memory: spill-after, the connection queue's soft limit
	// (1 MiB: frames the session already sent), and slack for the rest.
	if int64(after) > int64(before)+int64(cfg.SpillAfter)+int64(cfg.ConnQueueSoft)+3<<20 {
		t.Fatalf("heap grew by %.1f MB holding %d MB for a stalled reader", float64(after-before)/1e6, n*size>>20)
	}
	switch {
	case !persistent && (sp.Spilled.Load() == 0 || sp.Bytes.Load() == 0):
		t.Fatalf("nothing spilled (%d messages, %d bytes)", sp.Spilled.Load(), sp.Bytes.Load())
	case persistent && (sp.Spilled.Load() != 0 || sp.Cooled.Load() == 0 || stats.ColdBytes.Load() == 0):
		t.Fatalf("%d messages spilled, %d let go for the store to hold (%d bytes)", sp.Spilled.Load(), sp.Cooled.Load(), stats.ColdBytes.Load())
	}
	for i := range n {
		m := c.nextPublish()
		if want := fmt.Sprintf("%05d|", i); !strings.HasPrefix(string(m.Payload), want) || len(m.Payload) != size {
			t.Fatalf("message %d: %.6q (%d bytes)", i, m.Payload, len(m.Payload))
		}
		c.ack(m)
	}
	eventually(t, "the spill to empty", func() bool { return sp.Bytes.Load() == 0 && stats.ColdBytes.Load() == 0 })
	// Frames spilled after they were sent are let go when acknowledged,
	// unread; those spilled unsent were read back to be sent.
	if (!persistent && sp.Loaded.Load() == 0) || sp.Loaded.Load() > sp.Spilled.Load() || sp.Errors.Load() != 0 || stats.LoadErrors.Load() != 0 {
		t.Fatalf("spilled %d, read back %d, errors %d, load errors %d", sp.Spilled.Load(), sp.Loaded.Load(), sp.Errors.Load(), stats.LoadErrors.Load())
	}
}
