package integration

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// The tests in this file are the attacks of "Hostile clients II", run
// against the built binary: each one once succeeded.

// disconnectedWith waits for the broker to end w's connection and checks the
// DISCONNECT's reason code.
func disconnectedWith(t *testing.T, w *mqtttest.Worker, code byte) {
	t.Helper()
	select {
	case <-w.Done():
	case <-time.After(mqtttest.Timeout):
		t.Fatalf("%s: the broker did not disconnect it", w.ClientID)
	}
	var de *mqtttest.DisconnectError
	if err := w.Err(); !errors.As(err, &de) || de.ReasonCode != code {
		t.Fatalf("%s: connection ended with %v, want DISCONNECT %#x", w.ClientID, err, code)
	}
}

// TestInboundTopicAliasesAreBounded: the CONNACK offers a Topic Alias
// Maximum (16 by default) and the broker keeps a copy of each alias's topic
// for as long as the connection lasts, within 64 KiB. mochi kept the topic
// as a view into the packet that set it, allowed 65,535 aliases, and kept
// them with an offline session: three sessions that set 16 aliases each
// with 1 MB publishes pinned 48 MB. Past the maximum: DISCONNECT 0x94; past
// the bytes: DISCONNECT 0x97.
func TestInboundTopicAliasesAreBounded(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof")
	addr := p.addrs["tcp"]
	sub := dialWorker(t, addr, "sub")
	subscribeWorker(t, sub, "check/#")
	before := sampleHeap(t, p)
	payload := make([]byte, 1_000_000)
	var offered uint16
	for s := range 3 {
		w, err := mqtttest.DialWorker(addr, fmt.Sprintf("aliaser-%d", s), mqtttest.WorkerOptions{SessionExpiry: 3600, KeepAlive: 30})
		if err != nil {
			t.Fatal(err)
		}
		offered = w.Connack().TopicAliasMax
		for a := range uint16(16) {
			o := mqtttest.Outgoing{Topic: fmt.Sprintf("alias/%d/%d", s, a), Payload: payload, QoS: 1, TopicAlias: a + 1}
			if rc, err := w.PublishMessage(o); err != nil || rc != 0 {
				t.Fatalf("publish with alias %d: %#x %v", a+1, rc, err)
			}
		}
		w.Close() // the session stays, offline
	}
	after := sampleHeap(t, p)
	const bound = 8 << 20
	t.Logf("heap %.1f MiB before, %.1f MiB after 3 offline sessions set 16 aliases each with 1 MB publishes (bound +%.0f MiB; mochi kept 48 MB)",
		mib(before.heap), mib(after.heap), mib(bound))
	if after.heap > before.heap+bound {
		t.Fatalf("heap grew by %.1f MiB: the aliases keep the packets", mib(after.heap-before.heap))
	}
	if offered != 16 {
		t.Fatalf("CONNACK Topic Alias Maximum %d, want 16", offered)
	}

	w := dialWorker(t, addr, "aliaser")
	if rc, err := w.PublishMessage(mqtttest.Outgoing{Topic: "check/a", Payload: []byte("set"), QoS: 1, TopicAlias: 1}); err != nil || rc != 0 {
		t.Fatalf("publish setting alias 1: %#x %v", rc, err)
	}
	if rc, err := w.PublishMessage(mqtttest.Outgoing{Payload: []byte("by alias"), QoS: 1, TopicAlias: 1}); err != nil || rc != 0 {
		t.Fatalf("publish by alias 1: %#x %v", rc, err)
	}
	for _, want := range []string{"set", "by alias"} {
		if m := sub.Next(mqtttest.Timeout); m == nil || m.Topic != "check/a" || string(m.Payload) != want {
			t.Fatalf("subscriber got %+v, want %q on check/a", m, want)
		}
	}
	_, _ = w.PublishMessage(mqtttest.Outgoing{Topic: "check/b", Payload: []byte("x"), QoS: 1, TopicAlias: 17})
	disconnectedWith(t, w, 0x94) // Topic Alias invalid

	w = dialWorker(t, addr, "aliaser-long")
	long := strings.Repeat("l", 40<<10)
	if rc, err := w.PublishMessage(mqtttest.Outgoing{Topic: "check/" + long, Payload: []byte("x"), QoS: 1, TopicAlias: 1}); err != nil || rc != 0 {
		t.Fatalf("publish setting alias 1 to a 40 KiB topic: %#x %v", rc, err)
	}
	_, _ = w.PublishMessage(mqtttest.Outgoing{Topic: "check/2" + long, Payload: []byte("x"), QoS: 1, TopicAlias: 2})
	disconnectedWith(t, w, 0x97) // Quota exceeded: 64 KiB of alias topics
}

// cpuSeconds returns the user and system CPU time the broker has used.
func cpuSeconds(t *testing.T, p *proc) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ") // after the command name, which may hold spaces
	f := strings.Fields(rest)                  // f[11], f[12]: utime, stime (fields 14 and 15)
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // clock ticks; USER_HZ is 100 on Linux
}

// TestTopicDepthIsCapped: a topic or filter deeper than --max-topic-levels
// (128) is refused (SUBACK 0x8F, PUBACK 0x90; MQTT 3.1.1: SUBACK 0x80, a
// publish disconnects), and the one at the cap goes through. One SUBSCRIBE of
// 29,999 '+' levels once cost 7.45 s of CPU (mochi's topic walk was
// quadratic in depth).
func TestTopicDepthIsCapped(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	w := dialWorker(t, addr, "deep")
	at, past := strings.Repeat("a/", 127)+"a", strings.Repeat("a/", 128)+"a"
	for _, tc := range []struct {
		filter string
		want   byte
	}{{at, 1}, {past, 0x8F}, {"$share/g/" + at, 1}, {"$share/g/" + past, 0x8F}, {strings.Repeat("+/", 128) + "#", 0x8F}} {
		if rc, err := w.Subscribe(tc.filter, 1); err != nil || rc != tc.want {
			t.Fatalf("SUBSCRIBE to %d levels: %#x %v, want %#x", strings.Count(tc.filter, "/")+1, rc, err, tc.want)
		}
	}
	cpu := cpuSeconds(t, p)
	if rc, err := w.Subscribe(strings.Repeat("+/", 29_998)+"+", 1); err != nil || rc != 0x8F {
		t.Fatalf("SUBSCRIBE to 29,999 levels: %#x %v, want 0x8F", rc, err)
	}
	t.Logf("a SUBSCRIBE of 29,999 '+' levels cost %.2f s of the broker's CPU (7.45 s before the cap)", cpuSeconds(t, p)-cpu)
	for _, tc := range []struct {
		topic string
		want  byte
	}{{at, 0}, {past, 0x90}} {
		if rc, err := w.Publish(tc.topic, []byte("x"), 1); err != nil || rc != tc.want {
			t.Fatalf("PUBLISH to %d levels: %#x %v, want %#x", strings.Count(tc.topic, "/")+1, rc, err, tc.want)
		}
	}
	if m := w.Next(mqtttest.Timeout); m == nil || m.Topic != at {
		t.Fatalf("got %+v, want the publish at the cap", m)
	}

	v3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "deep-311", true, nil)
	if rc := v3.Subscribe(t, past, 1); rc != 0x80 {
		t.Fatalf("MQTT 3.1.1 SUBSCRIBE to 129 levels: %#x, want 0x80", rc)
	}
	if rc := v3.Subscribe(t, at, 1); rc != 1 {
		t.Fatalf("MQTT 3.1.1 SUBSCRIBE to 128 levels: %#x, want 1", rc)
	}
	tok := v3.Client.Publish(past, 1, false, "x")
	tok.WaitTimeout(mqtttest.Timeout)
	if tok.Error() == nil && v3.Client.IsConnectionOpen() {
		t.Fatal("MQTT 3.1.1 PUBLISH to 129 levels: still connected")
	}
}
