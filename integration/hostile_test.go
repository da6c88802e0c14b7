package integration

import (
	"errors"
	"fmt"
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
