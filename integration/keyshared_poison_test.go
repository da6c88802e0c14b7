package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func dialWorker(t *testing.T, addr, id string) *mqtttest.Worker {
	t.Helper()
	w, err := mqtttest.DialWorker(addr, id, mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30})
	if err != nil {
		t.Fatalf("worker %s: %v", id, err)
	}
	t.Cleanup(w.Close)
	return w
}

func subscribeWorker(t *testing.T, w *mqtttest.Worker, filter string) {
	t.Helper()
	if rc, err := w.Subscribe(filter, 1); err != nil || rc != 1 {
		t.Fatalf("subscribe %s: %#x %v", filter, rc, err)
	}
}

func publishKey(t *testing.T, w *mqtttest.Worker, topic, key, payload string) {
	t.Helper()
	if rc, err := w.Publish(topic, []byte(payload), 1, mqtttest.UserProperty{Key: "key", Value: key}); err != nil || rc != 0 {
		t.Fatalf("publish %s: %#x %v", payload, rc, err)
	}
}

func cliRun(t *testing.T, p *proc, args ...string) string {
	t.Helper()
	out, err := exec.Command(keylineBin, append(args, "--server", "http://"+p.addrs["http"])...).CombinedOutput()
	if err != nil {
		t.Fatalf("keyline %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPoisonMessageIsDeadLetteredAndReplayed: a member nacks one key's
// message every time; it is delivered --max-deliveries times, lands in the
// DLQ and on $dlq/..., other keys never wait for it, and `keyline dlq
// replay` brings it back.
func TestPoisonMessageIsDeadLetteredAndReplayed(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--max-deliveries", "3", "--retry-backoff", "100ms,200ms")
	addr := p.addrs["tcp"]
	dlq := dialWorker(t, addr, "dlq-watcher")
	subscribeWorker(t, dlq, "$dlq/#")
	w := dialWorker(t, addr, "worker")
	subscribeWorker(t, w, "$share/pay/jobs/#")
	pub := dialWorker(t, addr, "publisher")

	publishKey(t, pub, "jobs/charge", "bad", "bad:0")
	for i := range 20 {
		publishKey(t, pub, "jobs/charge", fmt.Sprintf("good-%d", i%4), fmt.Sprintf("good-%d:%d", i%4, i/4))
	}
	badDeliveries, good := 0, 0
	for good < 20 || badDeliveries < 3 {
		m := w.Next(mqtttest.Timeout)
		if m == nil {
			t.Fatalf("stalled: %d good acknowledged, %d deliveries of the bad message", good, badDeliveries)
		}
		if m.Key == "bad" {
			badDeliveries++
			if err := w.Nack(m, 0x80); err != nil {
				t.Fatal(err)
			}
			continue
		}
		good++
		if err := w.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
	d := dlq.Next(mqtttest.Timeout)
	if d == nil {
		t.Fatal("nothing on $dlq/#")
	}
	if d.Topic != "$dlq/pay/jobs/charge" || string(d.Payload) != "bad:0" {
		t.Errorf("dead letter %s %q, want $dlq/pay/jobs/charge \"bad:0\"", d.Topic, d.Payload)
	}
	for k, want := range map[string]string{"dlq-group": "pay/jobs/#", "dlq-key": "bad", "dlq-attempts": "3", "dlq-reason": "0x80"} {
		if v, _ := d.Prop(k); v != want {
			t.Errorf("dead letter property %s = %q, want %q", k, v, want)
		}
	}
	if extra := w.Next(300 * time.Millisecond); extra != nil {
		t.Fatalf("a 4th delivery after max-deliveries 3: %s %q", extra.Key, extra.Payload)
	}

	out := cliRun(t, p, "dlq", "list", "pay/jobs/#")
	if !strings.Contains(out, "bad") {
		t.Fatalf("keyline dlq list:\n%s", out)
	}
	cliRun(t, p, "dlq", "replay", "pay/jobs/#")
	m := w.Next(mqtttest.Timeout)
	if m == nil || m.Key != "bad" || string(m.Payload) != "bad:0" {
		t.Fatalf("after replay got %+v, want the dead letter back", m)
	}
	if err := w.Ack(m); err != nil {
		t.Fatal(err)
	}
	if out := cliRun(t, p, "dlq", "list", "pay/jobs/#"); strings.Contains(out, "bad:0") {
		t.Errorf("replayed dead letter still listed:\n%s", out)
	}
}

// TestBlockPolicyStopsOnlyThatKey: under --poison-policy block, a key whose
// message exhausted its deliveries stops; every other key goes on.
func TestBlockPolicyStopsOnlyThatKey(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--max-deliveries", "2", "--retry-backoff", "100ms", "--poison-policy", "block")
	addr := p.addrs["tcp"]
	w := dialWorker(t, addr, "worker")
	subscribeWorker(t, w, "$share/blk/jobs/#")
	pub := dialWorker(t, addr, "publisher")
	publishKey(t, pub, "jobs/x", "stuck", "stuck:0")
	publishKey(t, pub, "jobs/x", "stuck", "stuck:1") // behind the poisoned one: must never come
	for deliveries := 0; deliveries < 2; {
		m := w.Next(mqtttest.Timeout)
		if m == nil || m.Key != "stuck" || string(m.Payload) != "stuck:0" {
			t.Fatalf("got %+v, want stuck:0", m)
		}
		deliveries++
		_ = w.Nack(m, 0x80)
	}
	for i := range 10 {
		publishKey(t, pub, "jobs/x", "free", fmt.Sprintf("free:%d", i))
	}
	for i := range 10 {
		m := w.Next(mqtttest.Timeout)
		if m == nil || m.Key != "free" || string(m.Payload) != fmt.Sprintf("free:%d", i) {
			t.Fatalf("got %+v, want free:%d (only the blocked key may stop)", m, i)
		}
		_ = w.Ack(m)
	}
	out := cliRun(t, p, "groups", "show", "blk/jobs/#", "--json")
	if !strings.Contains(out, `"poisoned_keys": 1`) {
		t.Errorf("groups show: want poisoned_keys 1:\n%s", out)
	}
}

// TestWorkerThatCrashesOnAMessage: a worker that dies whenever it gets one
// message (closing TCP without DISCONNECT) sends that message to the DLQ
// after --max-deliveries; the rest flows.
func TestWorkerThatCrashesOnAMessage(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--max-deliveries", "2", "--retry-backoff", "100ms")
	addr := p.addrs["tcp"]
	dlq := dialWorker(t, addr, "dlq-watcher")
	subscribeWorker(t, dlq, "$dlq/#")
	pub := dialWorker(t, addr, "publisher")
	healthy := dialWorker(t, addr, "healthy")
	subscribeWorker(t, healthy, "$share/crash/jobs/#")
	publishKey(t, pub, "jobs/y", "kill", "kill:0")
	for i := range 30 {
		publishKey(t, pub, "jobs/y", fmt.Sprintf("k%d", i%6), fmt.Sprintf("ok:%d", i))
	}
	// A crashing worker joins again each time it dies, as a supervisor
	// restarts it; what it does process counts like the healthy worker's.
	okCh := make(chan string, 100)
	stop := make(chan struct{})
	crashDone := make(chan int, 1)
	go func() {
		crashes := 0
		defer func() { crashDone <- crashes }()
		for n := 0; ; n++ {
			cw, err := mqtttest.DialWorker(addr, fmt.Sprintf("crashy-%d", n), mqtttest.WorkerOptions{CleanStart: true})
			if err != nil {
				return
			}
			if rc, err := cw.Subscribe("$share/crash/jobs/#", 1); err != nil || rc != 1 {
				cw.Close()
				return
			}
			crashed := false
			for !crashed {
				select {
				case <-stop:
					cw.Close()
					return
				case m, ok := <-cw.Messages():
					if !ok {
						crashed = true
						break
					}
					if m.Key == "kill" {
						cw.Vanish()
						crashes++
						crashed = true
						break
					}
					_ = cw.Ack(m)
					okCh <- string(m.Payload)
				}
			}
			cw.Close()
		}
	}()
	ok := map[string]bool{}
	for len(ok) < 30 {
		select {
		case m := <-healthy.Messages():
			if m.Key == "kill" {
				// The key may move to the healthy worker after an eviction: it fails there too.
				_ = healthy.Nack(m, 0x80)
				continue
			}
			_ = healthy.Ack(m)
			ok[string(m.Payload)] = true
		case p := <-okCh:
			ok[p] = true
		case <-time.After(3 * mqtttest.Timeout):
			t.Fatalf("stalled after %d of 30 messages", len(ok))
		}
	}
	d := dlq.Next(3 * mqtttest.Timeout)
	close(stop)
	crashes := <-crashDone
	if d == nil || string(d.Payload) != "kill:0" {
		t.Fatalf("dead letter %+v, want kill:0 on $dlq/crash/jobs/y", d)
	}
	t.Logf("the crashing message took down %d workers before it was dead-lettered", crashes)
}

// TestStalledMemberDoesNotHoldTheGroup: a member that stops reading its
// socket keeps its keys only until their ack timeouts run out: its messages
// are retried and, past --max-deliveries, dead-lettered, while the other
// members' keys flow; the group's whole backlog resolves.
func TestStalledMemberDoesNotHoldTheGroup(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--ack-timeout", "300ms", "--max-deliveries", "2", "--retry-backoff", "50ms")
	addr := p.addrs["tcp"]
	stalled, err := mqtttest.DialWorker(addr, "stalled", mqtttest.WorkerOptions{CleanStart: true, Buffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stalled.Vanish)
	subscribeWorker(t, stalled, "$share/st/jobs/#") // and never reads a message
	healthy := []*mqtttest.Worker{dialWorker(t, addr, "h1"), dialWorker(t, addr, "h2")}
	for _, w := range healthy {
		subscribeWorker(t, w, "$share/st/jobs/#")
	}
	pub := dialWorker(t, addr, "publisher")
	const keys, perKey = 30, 10
	for s := range perKey {
		for k := range keys {
			publishKey(t, pub, "jobs/z", fmt.Sprintf("k%02d", k), fmt.Sprintf("k%02d:%d", k, s))
		}
	}
	// The healthy members ack what they get, in key order.
	acked := make(chan string, keys*perKey)
	for _, w := range healthy {
		go func() {
			for m := range w.Messages() {
				if w.Ack(m) == nil {
					acked <- string(m.Payload)
				}
			}
		}()
	}
	// Poll the group until nothing is left unresolved.
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(60 * time.Second)
	var detail string
	for {
		detail = cliRun(t, p, "groups", "show", "st/jobs/#", "--json")
		if strings.Contains(detail, `"backlog": 0,`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group never resolved its backlog:\n%s", detail)
		}
		<-poll.C
	}
	seen := map[string]int{}
	last := map[string]int{}
	for len(acked) > 0 {
		key, seq, _ := strings.Cut(<-acked, ":")
		n := 0
		fmt.Sscan(seq, &n)
		// The same message twice is a redelivery: its ack came after the
		// 300 ms ack timeout (a loaded machine). Going back is a violation.
		if prev, ok := last[key]; ok && n < prev {
			t.Errorf("key %s acknowledged %d after %d", key, n, prev)
		}
		last[key] = n
		seen[key]++
	}
	if !strings.Contains(detail, `"dead_lettered": `) || strings.Contains(detail, `"dead_lettered": 0,`) {
		t.Errorf("want the stalled member's messages dead-lettered after their timeouts:\n%s", detail)
	}
	total := 0
	for _, n := range seen {
		total += n
	}
	t.Logf("healthy members acknowledged %d of %d messages over %d keys; the rest timed out at the stalled member and were dead-lettered", total, keys*perKey, len(seen))
}
