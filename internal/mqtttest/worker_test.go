package mqtttest_test

// The worker's tests run against a real in-process broker. They live in an
// external test package: broker's tests import mqtttest, so mqtttest's own
// (internal) tests could not import broker.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/broker"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait in these tests.
const wait = 10 * time.Second

// startBroker starts a broker on loopback ports the kernel picks, with mod
// applied to its config, and shuts it down when the test ends. It returns the
// MQTT TCP address.
func startBroker(t *testing.T, mod func(*broker.Config)) string {
	t.Helper()
	return newBroker(t, mod).Addr("tcp")
}

// newBroker is startBroker returning the broker.
func newBroker(t *testing.T, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.DefaultConfig()
	cfg.TCP = "127.0.0.1:0"
	cfg.HTTP = "127.0.0.1:0"
	cfg.DataDir, cfg.SegmentSize = t.TempDir(), 1<<20
	cfg.Fsync = false
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg, nil)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return b
}

// fastRetries makes nacked messages come back after 100ms.
func fastRetries(ackTimeout time.Duration) func(*broker.Config) {
	return func(c *broker.Config) {
		c.RetryBackoff = []time.Duration{100 * time.Millisecond}
		c.AckTimeout = ackTimeout
	}
}

func dial(t *testing.T, addr, id string, opts mqtttest.WorkerOptions) *mqtttest.Worker {
	t.Helper()
	opts.CleanStart = true
	w, err := mqtttest.DialWorker(addr, id, opts)
	if err != nil {
		t.Fatalf("DialWorker %s: %v", id, err)
	}
	t.Cleanup(w.Close) // before the broker's shutdown (cleanups run last first)
	return w
}

func subscribe(t *testing.T, w *mqtttest.Worker, filter string, qos byte, keyFilters ...string) {
	t.Helper()
	rc, err := w.Subscribe(filter, qos, keyFilters...)
	if err != nil || rc != qos {
		t.Fatalf("%s: subscribe %s: reason 0x%02x, %v (want granted QoS %d)", w.ClientID, filter, rc, err, qos)
	}
}

func publish(t *testing.T, w *mqtttest.Worker, topic, key, payload string, qos byte) {
	t.Helper()
	rc, err := w.Publish(topic, []byte(payload), qos, mqtttest.UserProperty{Key: "key", Value: key})
	if err != nil || rc >= 0x80 {
		t.Fatalf("publish %s %q: reason 0x%02x, %v", topic, payload, rc, err)
	}
}

func next(t *testing.T, w *mqtttest.Worker) *mqtttest.WorkerMessage {
	t.Helper()
	m := w.Next(wait)
	if m == nil {
		t.Fatalf("%s: no message within %v (connection error: %v)", w.ClientID, wait, w.Err())
	}
	return m
}

// expect receives the next message and checks its payload and key.
func expect(t *testing.T, w *mqtttest.Worker, key, payload string) *mqtttest.WorkerMessage {
	t.Helper()
	m := next(t, w)
	if string(m.Payload) != payload || m.Key != key {
		t.Fatalf("%s: got %q (key %q) on %s, want %q (key %q)", w.ClientID, m.Payload, m.Key, m.Topic, payload, key)
	}
	return m
}

func ack(t *testing.T, w *mqtttest.Worker, m *mqtttest.WorkerMessage) {
	t.Helper()
	if err := w.Ack(m); err != nil {
		t.Fatalf("ack %q: %v", m.Payload, err)
	}
}

func nack(t *testing.T, w *mqtttest.Worker, m *mqtttest.WorkerMessage, reason byte) {
	t.Helper()
	if err := w.Nack(m, reason); err != nil {
		t.Fatalf("nack %q: %v", m.Payload, err)
	}
}

// TestWorkerProtocol checks the frames themselves against the broker: CONNACK,
// SUBACK, publishes and deliveries at every QoS with user properties and
// message expiry, UNSUBACK, a refused key filter, a clean disconnect.
func TestWorkerProtocol(t *testing.T) {
	addr := startBroker(t, nil)
	sub := dial(t, addr, "sub", mqtttest.WorkerOptions{ReceiveMaximum: 10, KeepAlive: 30})
	if ca := sub.Connack(); ca.ReasonCode != 0 || ca.SessionPresent || ca.ReceiveMaximum == 0 {
		t.Fatalf("CONNACK %+v", ca)
	}
	subscribe(t, sub, "plain/#", 2)
	pub := dial(t, addr, "pub", mqtttest.WorkerOptions{})
	for qos := byte(0); qos <= 2; qos++ {
		payload := fmt.Sprintf("m%d", qos)
		rc, err := pub.Publish("plain/t", []byte(payload), qos,
			mqtttest.UserProperty{Key: "key", Value: "k" + payload}, mqtttest.UserProperty{Key: "other", Value: "x"})
		if err != nil || rc != 0 {
			t.Fatalf("publish QoS %d: reason 0x%02x, %v", qos, rc, err)
		}
		m := expect(t, sub, "k"+payload, payload)
		if v, _ := m.Prop("other"); m.QoS != qos || m.Topic != "plain/t" || v != "x" || (qos > 0) != (m.PacketID != 0) {
			t.Fatalf("got %+v", m)
		}
		ack(t, sub, m) // PUBACK, or PUBREC then PUBCOMP on the broker's PUBREL
	}

	// A message expiry reaches a Key-Shared member (as the remaining interval);
	// a message without the key property has no Key.
	subscribe(t, sub, "$share/g/exp/#", 1)
	if rc, err := pub.PublishMessage(mqtttest.Outgoing{Topic: "exp/t", Payload: []byte("e"), QoS: 1, MessageExpiry: 60}); err != nil || rc != 0 {
		t.Fatalf("publish: 0x%02x %v", rc, err)
	}
	m := next(t, sub)
	if !m.HasExpiry || m.MessageExpiry > 60 || m.MessageExpiry < 50 || m.Key != "" || string(m.Payload) != "e" {
		t.Fatalf("want payload e, expiry about 60s and no key; got %+v", m)
	}
	ack(t, sub, m)

	if rc, err := sub.Subscribe("$share/g/bad/#", 1, ""); err != nil || rc != 0x8F {
		t.Fatalf("empty key filter: SUBACK 0x%02x, %v; want 0x8F", rc, err)
	}
	if rc, err := sub.Unsubscribe("plain/#"); err != nil || rc != 0 {
		t.Fatalf("UNSUBACK 0x%02x, %v", rc, err)
	}
	if rc, err := sub.Unsubscribe("never/subscribed"); err != nil || rc != 0x11 {
		t.Fatalf("UNSUBACK 0x%02x, %v; want 0x11 no subscription existed", rc, err)
	}
	if err := sub.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	if _, ok := <-sub.Messages(); ok {
		t.Fatal("Messages still open after Disconnect")
	}
	if _, err := sub.Publish("x", nil, 1); err == nil {
		t.Fatal("publish after Disconnect succeeded")
	}
	if err := sub.Err(); err != nil {
		t.Fatalf("Err after our own Disconnect: %v", err)
	}
}

// TestWorkerRefusedConnect: credentials are sent, and a CONNACK failure code
// is a *ConnectError.
func TestWorkerRefusedConnect(t *testing.T) {
	addr := startBroker(t, func(c *broker.Config) {
		c.Auth = &auth.Ledger{Auth: auth.AuthRules{{Username: "worker", Password: "secret", Allow: true}}}
	})
	dial(t, addr, "ok", mqtttest.WorkerOptions{Username: "worker", Password: "secret"})
	w, err := mqtttest.DialWorker(addr, "bad", mqtttest.WorkerOptions{Username: "worker", Password: "wrong"})
	if err == nil {
		w.Close()
		t.Fatal("a wrong password was accepted")
	}
	var ce *mqtttest.ConnectError
	if !errors.As(err, &ce) || ce.ReasonCode != 0x86 {
		t.Fatalf("got %v, want CONNACK 0x86 bad user name or password", err)
	}
}

// TestWorkerAckRemovesMessage: an acked message never comes back, while one
// whose ack is withheld is redelivered after the ack timeout; the next
// message of a key waits for the ack of the one before.
func TestWorkerAckRemovesMessage(t *testing.T) {
	addr := startBroker(t, fastRetries(300*time.Millisecond))
	w := dial(t, addr, "worker", mqtttest.WorkerOptions{})
	subscribe(t, w, "$share/g/jobs/#", 1)
	pub := dial(t, addr, "pub", mqtttest.WorkerOptions{})

	publish(t, pub, "jobs/a", "a", "a1", 1)
	publish(t, pub, "jobs/a", "a", "a2", 1)
	ack(t, w, expect(t, w, "a", "a1"))
	ack(t, w, expect(t, w, "a", "a2"))

	// Published after both acks, so its ack timeout ends after theirs would.
	publish(t, pub, "jobs/c", "c", "c1", 1)
	first := expect(t, w, "c", "c1")
	start := time.Now()
	again := expect(t, w, "c", "c1") // withheld: it comes back, and nothing acked does before it
	took := time.Since(start)
	if again.PacketID == first.PacketID {
		t.Errorf("redelivery reused packet id %d of the unanswered delivery", first.PacketID)
	}
	ack(t, w, again)
	t.Logf("withheld ack: redelivered after %v (ack timeout 300ms + backoff 100ms); acked messages not redelivered", took.Round(time.Millisecond))
	if took < 300*time.Millisecond {
		t.Errorf("redelivered after %v, before the ack timeout", took)
	}

	publish(t, pub, "jobs/a", "a", "a3", 1) // the group goes on
	ack(t, w, expect(t, w, "a", "a3"))
}

// TestWorkerNackRedelivers: a nack (0x80 on PUBACK, and on PUBREC at QoS 2)
// brings the same message back after the retry backoff, ahead of the next
// message of its key.
func TestWorkerNackRedelivers(t *testing.T) {
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("qos%d", qos), func(t *testing.T) {
			addr := startBroker(t, fastRetries(5*time.Second))
			w := dial(t, addr, "worker", mqtttest.WorkerOptions{})
			subscribe(t, w, "$share/g/jobs/#", qos)
			pub := dial(t, addr, "pub", mqtttest.WorkerOptions{})
			publish(t, pub, "jobs/1", "k", "m1", qos)
			publish(t, pub, "jobs/1", "k", "m2", qos)

			m := expect(t, w, "k", "m1")
			start := time.Now()
			nack(t, w, m, mqtttest.ReasonUnspecifiedError)
			back := expect(t, w, "k", "m1")
			took := time.Since(start)
			t.Logf("QoS %d nack 0x80: redelivered after %v (backoff 100ms, ack timeout 5s)", qos, took.Round(time.Millisecond))
			if took < 100*time.Millisecond || took >= 5*time.Second {
				t.Errorf("redelivered after %v, want the 100ms backoff (not the 5s ack timeout)", took)
			}
			if back.QoS != qos || back.Topic != "jobs/1" {
				t.Errorf("redelivery %+v", back)
			}
			ack(t, w, back)
			ack(t, w, expect(t, w, "k", "m2"))
		})
	}
}

// checkDeadLetter checks a message received on $dlq/# against the original.
func checkDeadLetter(t *testing.T, d *mqtttest.WorkerMessage, group, topic, key, payload string, attempts int, reason byte) {
	t.Helper()
	want := map[string]string{
		"dlq-group": group, "dlq-key": key, "dlq-attempts": strconv.Itoa(attempts), "dlq-reason": fmt.Sprintf("0x%02x", reason),
	}
	for k, v := range want {
		if got, _ := d.Prop(k); got != v {
			t.Errorf("dead letter %s = %q, want %q (properties %v)", k, got, v, d.User)
		}
	}
	if off, ok := d.Prop("dlq-offset"); !ok {
		t.Errorf("dead letter without dlq-offset: %v", d.User)
	} else if _, err := strconv.ParseUint(off, 10, 64); err != nil {
		t.Errorf("dlq-offset %q: %v", off, err)
	}
	// $dlq/<share name>/<topic>: the group's filter may hold wildcards, which
	// a topic name may not; dlq-group names the whole group.
	share, _, _ := strings.Cut(group, "/")
	if want := "$dlq/" + share + "/" + topic; d.Topic != want {
		t.Errorf("dead letter topic %q, want %q", d.Topic, want)
	}
	if string(d.Payload) != payload || d.Key != key {
		t.Errorf("dead letter %q (key %q), want %q (key %q)", d.Payload, d.Key, payload, key)
	}
}

// TestWorkerRejectDeadLetters: 0x99 and 0x87 dead-letter at once (the next
// message of the key follows, no retry comes first), onto $dlq/<share>/<topic>
// with the dlq-* properties.
func TestWorkerRejectDeadLetters(t *testing.T) {
	addr := startBroker(t, fastRetries(5*time.Second))
	w := dial(t, addr, "worker", mqtttest.WorkerOptions{})
	subscribe(t, w, "$share/g/jobs/#", 1)
	dlq := dial(t, addr, "dlq-watcher", mqtttest.WorkerOptions{})
	subscribe(t, dlq, "$dlq/#", 1)
	pub := dial(t, addr, "pub", mqtttest.WorkerOptions{})

	reasons := []byte{mqtttest.ReasonPayloadFormatInvalid, mqtttest.ReasonNotAuthorized}
	for i, reason := range reasons {
		bad, good := fmt.Sprintf("bad%d", i), fmt.Sprintf("good%d", i)
		publish(t, pub, "jobs/x", "k", bad, 1)
		publish(t, pub, "jobs/x", "k", good, 1)
		nack(t, w, expect(t, w, "k", bad), reason)
		ack(t, w, expect(t, w, "k", good)) // no retry of bad came first
	}
	for i, reason := range reasons {
		d := next(t, dlq)
		ack(t, dlq, d)
		checkDeadLetter(t, d, "g/jobs/#", "jobs/x", "k", fmt.Sprintf("bad%d", i), 1, reason)
		t.Logf("reason 0x%02x: dead letter on %s with %v", reason, d.Topic, d.User)
	}
}

// TestWorkerPoisonAfterMaxDeliveries: with max-deliveries 3 a message nacked
// every time is delivered exactly 3 times, then dead-lettered, while another
// key keeps flowing, also while the poison message is in flight.
func TestWorkerPoisonAfterMaxDeliveries(t *testing.T) {
	addr := startBroker(t, func(c *broker.Config) {
		fastRetries(5 * time.Second)(c)
		c.MaxDeliveries = 3
	})
	w := dial(t, addr, "worker", mqtttest.WorkerOptions{})
	subscribe(t, w, "$share/g/jobs/#", 1)
	dlq := dial(t, addr, "dlq-watcher", mqtttest.WorkerOptions{})
	subscribe(t, dlq, "$dlq/#", 1)
	pub := dial(t, addr, "pub", mqtttest.WorkerOptions{})

	const perRound = 10
	okSeq, deliveries := 0, 0
	// flow publishes perRound messages of key "ok" and checks that each
	// arrives, in order, and is acked.
	flow := func() {
		for range perRound {
			publish(t, pub, "jobs/ok", "ok", fmt.Sprintf("ok-%d", okSeq), 1)
			ack(t, w, expect(t, w, "ok", fmt.Sprintf("ok-%d", okSeq)))
			okSeq++
		}
	}
	publish(t, pub, "jobs/poison", "p", "poison", 1)
	for range 3 {
		m := expect(t, w, "p", "poison")
		deliveries++
		flow() // the other key flows while "p" waits for our answer
		nack(t, w, m, mqtttest.ReasonUnspecifiedError)
	}
	// After 3 attempts "p" is resolved: its next message flows, and no 4th
	// delivery of the poison message comes before it.
	publish(t, pub, "jobs/poison", "p", "p-after", 1)
	ack(t, w, expect(t, w, "p", "p-after"))
	flow()
	t.Logf("poison delivered %d times, then resolved; key ok: %d messages in order meanwhile", deliveries, okSeq)

	d := next(t, dlq)
	ack(t, dlq, d)
	checkDeadLetter(t, d, "g/jobs/#", "jobs/poison", "p", "poison", 3, mqtttest.ReasonUnspecifiedError)
}

// TestWorkerKeyFilters: SUBSCRIBE key-filter user properties split keys
// between members.
func TestWorkerKeyFilters(t *testing.T) {
	addr := startBroker(t, nil)
	a := dial(t, addr, "a", mqtttest.WorkerOptions{})
	subscribe(t, a, "$share/g/jobs/#", 1, "a*")
	b := dial(t, addr, "b", mqtttest.WorkerOptions{})
	subscribe(t, b, "$share/g/jobs/#", 1, "b*", "c?")
	pub := dial(t, addr, "pub", mqtttest.WorkerOptions{})
	for _, k := range []string{"a1", "b1", "c1", "a2", "aa", "b2"} {
		publish(t, pub, "jobs/t", k, "to-"+k, 1)
	}
	for _, k := range []string{"a1", "a2", "aa"} {
		ack(t, a, expect(t, a, k, "to-"+k))
	}
	for _, k := range []string{"b1", "c1", "b2"} {
		ack(t, b, expect(t, b, k, "to-"+k))
	}
}

// TestWorkerVanish: a worker that vanishes (TCP closed, no DISCONNECT)
// holding an unacked message loses it to the other member: at once when its
// session ended with the connection, after the eviction grace (3s) when its
// session outlives the connection.
func TestWorkerVanish(t *testing.T) {
	for _, expiry := range []uint32{0, 60} {
		t.Run(fmt.Sprintf("session-expiry-%d", expiry), func(t *testing.T) {
			addr := startBroker(t, nil)
			a := dial(t, addr, "a", mqtttest.WorkerOptions{KeepAlive: 30, SessionExpiry: expiry})
			subscribe(t, a, "$share/g/jobs/#", 1)
			pub := dial(t, addr, "pub", mqtttest.WorkerOptions{})
			publish(t, pub, "jobs/t", "k", "m1", 1)
			expect(t, a, "k", "m1") // held, never acked

			b := dial(t, addr, "b", mqtttest.WorkerOptions{})
			subscribe(t, b, "$share/g/jobs/#", 1)
			start := time.Now()
			a.Vanish()
			select {
			case <-a.Done():
			default:
				t.Fatal("Vanish returned before the reader exited")
			}
			if err := a.Ack(&mqtttest.WorkerMessage{QoS: 1, PacketID: 1}); !errors.Is(err, mqtttest.ErrWorkerClosed) {
				t.Errorf("ack after Vanish: %v, want ErrWorkerClosed", err)
			}
			ack(t, b, expect(t, b, "k", "m1"))
			took := time.Since(start)
			t.Logf("session expiry %ds: vanished member's message redelivered to the other member after %v", expiry, took.Round(time.Millisecond))
			if expiry > 0 && took < 2*time.Second {
				t.Errorf("redelivered after %v, before the eviction grace", took)
			}
			a.Vanish() // idempotent
			a.Close()
		})
	}
}

// TestWorkerBrokerGone: when the broker goes away, Messages closes, Err says
// why, and calls fail instead of hanging.
func TestWorkerBrokerGone(t *testing.T) {
	cfg := broker.DefaultConfig()
	cfg.TCP, cfg.HTTP, cfg.DataDir, cfg.Fsync, cfg.SegmentSize = "127.0.0.1:0", "", t.TempDir(), false, 1<<20
	b, err := broker.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	w, err := mqtttest.DialWorker(b.Addr("tcp"), "w", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
	case <-time.After(wait):
		t.Fatal("worker still connected after broker shutdown")
	}
	if w.Err() == nil {
		t.Error("Err is nil after the broker closed the connection")
	}
	if _, err := w.Subscribe("x", 1); err == nil {
		t.Error("subscribe on a closed worker succeeded")
	}
	t.Logf("after broker shutdown: %v", w.Err())
}

// TestWorkerOverWebSocket: ConnectWorker speaks over any net.Conn.
func TestWorkerOverWebSocket(t *testing.T) {
	b := newBroker(t, func(c *broker.Config) { c.WS = "127.0.0.1:0" })
	w, err := mqtttest.ConnectWorker(mqtttest.Dial(t, mqtttest.WS, b.Addr("ws"), nil), "ws-worker", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	subscribe(t, w, "$share/g/ws/#", 2)
	pub := dial(t, b.Addr("tcp"), "pub", mqtttest.WorkerOptions{})
	publish(t, pub, "ws/t", "k", "over-ws", 2)
	ack(t, w, expect(t, w, "k", "over-ws"))
}
