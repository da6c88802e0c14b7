package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/broker"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFleetSmoke runs a small fleet against an in-process broker with a
// Key-Shared member listening: every message arrives once, each device's
// sequence numbers in order, keyed by topic.
func TestFleetSmoke(t *testing.T) {
	cfg := broker.DefaultConfig()
	cfg.TCP, cfg.HTTP, cfg.DataDir, cfg.Fsync, cfg.SegmentSize = "127.0.0.1:0", "", t.TempDir(), false, 1<<20
	b, err := broker.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	addr := b.Addr("tcp")

	w, err := mqtttest.DialWorker(addr, "member", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if rc, err := w.Subscribe("$share/g/telemetry/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: 0x%02x %v", rc, err)
	}

	const devices, count = 3, 10
	o, err := parseFlags([]string{"--broker", addr, "--devices", "3", "--rate", "200", "--count", "10", "--duration", "0", "--report", "0"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s, err := run(t.Context(), o, &out)
	t.Logf("%s", out.String())
	if err != nil || s.Published != devices*count || s.Failed != 0 {
		t.Fatalf("run: %v, %+v", err, s)
	}

	next := map[string]int{}
	for range devices * count {
		m := w.Next(10 * time.Second)
		if m == nil {
			t.Fatalf("received %v, want %d per device", next, count)
		}
		var p struct {
			Device string `json:"device"`
			Seq    int    `json:"seq"`
		}
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			t.Fatalf("payload %q: %v", m.Payload, err)
		}
		if m.Topic != "telemetry/"+p.Device || m.Key != "" {
			t.Fatalf("topic %s key %q for device %s", m.Topic, m.Key, p.Device)
		}
		if p.Seq != next[p.Device]+1 {
			t.Fatalf("device %s: seq %d after %d", p.Device, p.Seq, next[p.Device])
		}
		next[p.Device] = p.Seq
		if err := w.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
	if len(next) != devices {
		t.Fatalf("devices seen: %v", next)
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--broker", "127.0.0.1:1884"}, &bytes.Buffer{})
	if err != nil || o.broker != "tcp://127.0.0.1:1884" || o.devices != 10 {
		t.Fatalf("%+v %v", o, err)
	}
	for _, args := range [][]string{{"--devices", "0"}, {"--rate", "0"}, {"--qos", "3"}, {"--topic", "a/#"}} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
