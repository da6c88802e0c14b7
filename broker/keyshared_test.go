package broker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestKeySharedKeepsKeyOrderAcrossMembers sends keyed QoS 1 messages to a
// group of MQTT 5 members: every message arrives once, each key on one
// member, in publish order, and the keys spread over all members.
func TestKeySharedKeepsKeyOrderAcrossMembers(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	const members, keys, perKey = 4, 200, 20
	type rec struct {
		member string
		key    string
		seq    int
	}
	var mu sync.Mutex
	var got []rec
	done := make(chan struct{})
	total := keys * perKey
	for i := range members {
		id := fmt.Sprintf("worker-%d", i)
		c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
		c.Client.AddOnPublishReceived(func(r paho.PublishReceived) (bool, error) {
			key, seq, _ := strings.Cut(string(r.Packet.Payload), ":")
			n, _ := strconv.Atoi(seq)
			mu.Lock()
			got = append(got, rec{id, key, n})
			if len(got) == total {
				close(done)
			}
			mu.Unlock()
			return true, nil
		})
		if rc := c.Subscribe(t, paho.SubscribeOptions{Topic: "$share/workers/orders/#", QoS: 1}); rc[0] != 1 {
			t.Fatalf("SUBACK %#x", rc[0])
		}
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for s := range perKey {
		for k := range keys {
			key := fmt.Sprintf("k%03d", k)
			rc := pub.Publish(t, &paho.Publish{Topic: "orders/new", QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", key, s),
				Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
			if rc != 0 {
				t.Fatalf("publish reason %#x", rc)
			}
		}
	}
	select {
	case <-done:
	case <-t.Context().Done():
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != total {
		t.Fatalf("received %d of %d", len(got), total)
	}
	owner := map[string]string{}
	next := map[string]int{}
	perMember := map[string]int{}
	for _, r := range got {
		if o, ok := owner[r.key]; ok && o != r.member {
			t.Fatalf("key %s went to %s and %s", r.key, o, r.member)
		}
		owner[r.key] = r.member
		if r.seq != next[r.key] {
			t.Fatalf("key %s: got seq %d, want %d", r.key, r.seq, next[r.key])
		}
		next[r.key]++
		perMember[r.member]++
	}
	if len(perMember) != members {
		t.Errorf("keys spread over %d members, want %d: %v", len(perMember), members, perMember)
	}
	t.Logf("messages per member: %v", perMember)
}

// TestEvictedMemberDoesNotGetItsOldMessageOnResume: a persistent-session
// member vanishes holding a message; after the eviction grace the message
// goes to another member, and when the first resumes its session mochi
// must not resend it (the hook removed it from the session's inflight state).
func TestEvictedMemberDoesNotGetItsOldMessageOnResume(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	opts := mqtttest.WorkerOptions{SessionExpiry: 300, KeepAlive: 30}
	w1, err := mqtttest.DialWorker(addr, "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := w1.Subscribe("$share/ev/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	if rc, err := w1.Subscribe("sync/w1", 0); err != nil || rc != 0 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "jobs/a", QoS: 1, Payload: []byte("job-1")})
	if m := w1.Next(mqtttest.Timeout); m == nil || string(m.Payload) != "job-1" {
		t.Fatalf("w1 got %+v", m)
	}
	w1.Vanish() // holding job-1, unacknowledged

	w2, err := mqtttest.DialWorker(addr, "w2", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w2.Close)
	if rc, err := w2.Subscribe("$share/ev/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	m := w2.Next(3 * mqtttest.Timeout) // after the 3 s eviction grace
	if m == nil || string(m.Payload) != "job-1" {
		t.Fatalf("w2 got %+v, want job-1 after w1's eviction", m)
	}
	if err := w2.Ack(m); err != nil {
		t.Fatal(err)
	}

	// w1 resumes its session. mochi resends a session's inflight messages
	// right after CONNACK, before it reads anything: a sentinel published
	// after the resume must be the first thing w1 sees.
	opts.CleanStart = false
	w1, err = mqtttest.DialWorker(addr, "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w1.Close)
	if !w1.Connack().SessionPresent {
		t.Fatal("session not present on resume")
	}
	pub.Publish(t, &paho.Publish{Topic: "sync/w1", QoS: 0, Payload: []byte("sentinel")})
	if m := w1.Next(mqtttest.Timeout); m == nil || string(m.Payload) != "sentinel" {
		t.Fatalf("w1 got %+v first after resuming, want the sentinel (job-1 belongs to w2 now)", m)
	}
}

// TestKeyFiltersOfAPersistentMemberSurviveARestart: a persistent member's
// key filters come back with its session after the broker restarts.
func TestKeyFiltersOfAPersistentMemberSurviveARestart(t *testing.T) {
	cfg := testConfig(t)
	b1, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b1.Start(); err != nil {
		t.Fatal(err)
	}
	opts := mqtttest.WorkerOptions{SessionExpiry: 300, KeepAlive: 30}
	w1, err := mqtttest.DialWorker(b1.Addr("tcp"), "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := w1.Subscribe("$share/kf/jobs/#", 1, "a*"); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	_ = w1.Disconnect()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	b2 := startBroker(t, cfg)
	addr := b2.Addr("tcp")
	opts.CleanStart = false
	w1, err = mqtttest.DialWorker(addr, "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w1.Close)
	w2, err := mqtttest.DialWorker(addr, "w2", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w2.Close)
	if rc, err := w2.Subscribe("$share/kf/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for i := range 20 {
		for _, prefix := range []string{"a", "b"} {
			key := fmt.Sprintf("%s%02d", prefix, i)
			pub.Publish(t, &paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte(key),
				Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
		}
	}
	got := takeKeyFiltered(t, w1, w2, 40)
	if got["w1"] == 0 {
		t.Fatalf("the resumed member got nothing: %v", got)
	}
	t.Logf("deliveries: %v", got)
}

// takeKeyFiltered takes n group deliveries from w1, whose key filter is
// "a*", and w2, which takes any key, acknowledging each, and returns how
// many each got; a key w1's filter does not cover fails the test.
func takeKeyFiltered(t *testing.T, w1, w2 *mqtttest.Worker, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for got["w1"]+got["w2"] < n {
		select {
		case m := <-w1.Messages():
			if !strings.HasPrefix(m.Key, "a") {
				t.Fatalf("w1 (key filter a*) got key %s", m.Key)
			}
			got["w1"]++
			_ = w1.Ack(m)
		case m := <-w2.Messages():
			got["w2"]++
			_ = w2.Ack(m)
		case <-time.After(mqtttest.Timeout):
			t.Fatalf("stalled after %v", got)
		}
	}
	return got
}

func TestMalformedSharedSubscriptionsGet0x8F(t *testing.T) {
	b := startBroker(t, testConfig(t))
	w, err := mqtttest.DialWorker(b.Addr("tcp"), "w", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	for _, tc := range []struct {
		filter string
		keys   []string
	}{
		{"$share//orders/#", nil},           // empty share name
		{"$share/g/", nil},                  // empty filter
		{"$share/g", nil},                   // no filter
		{"$share/g+/orders/#", nil},         // wildcard in the share name
		{"$share/g/orders/#/x", nil},        // '#' not last
		{"$share/g/orders/#", []string{""}}, // empty key filter
	} {
		if rc, err := w.Subscribe(tc.filter, 1, tc.keys...); err != nil || rc != 0x8F {
			t.Errorf("SUBSCRIBE %q key filters %q = %#x %v, want 0x8F", tc.filter, tc.keys, rc, err)
		}
	}
	if rc, err := w.Subscribe("$share/g/orders/#", 1, "eu-*", "us-?"); err != nil || rc != 1 {
		t.Errorf("a well-formed shared subscription = %#x %v, want granted QoS 1", rc, err)
	}
}
