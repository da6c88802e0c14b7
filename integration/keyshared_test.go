package integration

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// ledger records every delivery the moment it comes off a member's socket
// (mqtttest.Tap), before paho's callback runs. A key's next message is only
// dispatched after its previous one is acknowledged, which happens after it
// was read off the wire, so the first record of each message is in causal
// order per key. Records by members that left are the exception: a message
// in flight at a member when it leaves is revoked and sent to another, and
// the leaver's socket may still hand it over after that (TestKeySharedChurn
// once failed on exactly this when it recorded in paho's callback).
type ledger struct {
	mu       sync.Mutex
	byKey    map[string][]seen
	total    int
	progress chan struct{}
	// done records, per key and sequence number, when a member finished
	// with a delivery (its callback returned; the PUBACK goes out after).
	done map[string]map[int][]time.Time
	// describe, when set, adds what the broker says to an incomplete run's failure.
	describe func() string
}

type seen struct {
	seq    int
	member string
	at     time.Time
}

func newLedger() *ledger {
	return &ledger{byKey: map[string][]seen{}, progress: make(chan struct{}, 1), done: map[string]map[int][]time.Time{}}
}

func (l *ledger) record(member string, payload []byte) {
	key, seq, _ := strings.Cut(string(payload), ":")
	n, _ := strconv.Atoi(seq)
	l.mu.Lock()
	l.byKey[key] = append(l.byKey[key], seen{n, member, time.Now()})
	l.total++
	l.mu.Unlock()
	select {
	case l.progress <- struct{}{}:
	default:
	}
}

// finished records that a member is done with a delivery: its
// acknowledgement is written after this.
func (l *ledger) finished(payload []byte) {
	key, seq, _ := strings.Cut(string(payload), ":")
	n, _ := strconv.Atoi(seq)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done[key] == nil {
		l.done[key] = map[int][]time.Time{}
	}
	l.done[key][n] = append(l.done[key][n], now)
}

// checkOverlaps verifies that no key ever had two messages out at once: the
// first delivery of each message came off the wire after some member had
// finished with the previous message of its key (and so before that
// member's acknowledgement). It returns how many pairs it checked.
func (l *ledger) checkOverlaps(t *testing.T) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	pairs := 0
	for key, s := range l.byKey {
		firstAt := map[int]time.Time{}
		for _, d := range s {
			if _, ok := firstAt[d.seq]; !ok {
				firstAt[d.seq] = d.at
			}
		}
		for seq, at := range firstAt {
			if seq == 0 {
				continue
			}
			ok := false
			for _, done := range l.done[key][seq-1] {
				if !done.After(at) {
					ok = true
					break
				}
			}
			if !ok {
				t.Fatalf("key %s: seq %d arrived at %v, before any member had finished seq %d (%v)", key, seq, at.Format(time.StampMicro), seq-1, l.done[key][seq-1])
			}
			pairs++
		}
	}
	return pairs
}

// complete reports whether every key has delivered its last sequence number.
func (l *ledger) complete(keys, perKey int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.byKey) < keys {
		return false
	}
	for _, s := range l.byKey {
		if !slices.ContainsFunc(s, func(d seen) bool { return d.seq == perKey-1 }) {
			return false
		}
	}
	return true
}

func (l *ledger) waitComplete(t *testing.T, keys, perKey int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for !l.complete(keys, perKey) {
		select {
		case <-l.progress:
		case <-time.After(100 * time.Millisecond): // re-check: progress may have been signalled while counting
		case <-deadline:
			var more string
			if l.describe != nil {
				more = l.describe()
			}
			l.mu.Lock()
			t.Fatalf("incomplete after %v: %d deliveries, %d keys seen%s", within, l.total, len(l.byKey), more)
		}
	}
}

// check verifies per-key order and completeness and returns the duplicates:
//   - the first deliveries of a key's messages come in sequence order, none missing;
//   - a member that stayed never gets a key's messages out of order or twice;
//   - a message delivered more than once went to at most one member that
//     stayed: every other copy went to a member in departed (it was in flight
//     there when the member left).
func (l *ledger) check(t *testing.T, keys, perKey int, departed map[string]bool) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	dups := 0
	for k := range keys {
		key := fmt.Sprintf("key-%04d", k)
		next := 0
		lastOf := map[string]int{}
		stayed := map[int]int{} // seq -> deliveries to members that stayed
		for i, d := range l.byKey[key] {
			switch {
			case d.seq == next:
				next++
			case d.seq > next:
				t.Fatalf("key %s: record %d: seq %d (member %s) before seq %d was delivered: out of order or lost", key, i, d.seq, d.member, next)
			default:
				dups++
			}
			if departed[d.member] {
				continue
			}
			if last, ok := lastOf[d.member]; ok && d.seq <= last {
				t.Fatalf("key %s: member %s got seq %d after seq %d", key, d.member, d.seq, last)
			}
			lastOf[d.member] = d.seq
			if stayed[d.seq]++; stayed[d.seq] > 1 {
				t.Fatalf("key %s: seq %d delivered to %d members that stayed", key, d.seq, stayed[d.seq])
			}
		}
		if next != perKey {
			t.Fatalf("key %s: delivered up to seq %d, want %d", key, next-1, perKey-1)
		}
	}
	return dups
}

// member joins the group with an auto-acknowledging MQTT 5 client.
type member struct {
	id   string
	conn net.Conn
	c    *paho.Client
}

func addMember(t *testing.T, addr, id, filter string, l *ledger) *member {
	t.Helper()
	m := &member{id: id, conn: mqtttest.Dial(t, mqtttest.TCP, addr, nil)}
	m.c = paho.NewClient(paho.ClientConfig{
		ClientID: id,
		Conn:     mqtttest.Tap(m.conn, 5, func(_ string, payload []byte) { l.record(id, payload) }),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(p paho.PublishReceived) (bool, error) {
			l.finished(p.Packet.Payload)
			return true, nil
		}},
	})
	ctx := t.Context()
	if _, err := m.c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.stop)
	if _, err := m.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *member) stop() {
	select {
	case <-m.c.Done():
	default:
		_ = m.c.Disconnect(&paho.Disconnect{})
		<-m.c.Done()
	}
}

// vanish drops the TCP connection without DISCONNECT, as a crashed worker does.
func (m *member) vanish() {
	_ = m.conn.Close()
	<-m.c.Done()
}

// publishKeyed publishes perKey QoS 1 messages for each key from pubs
// publishers in parallel (publisher p owns keys p, p+pubs, ...), calling
// between(s) before round s.
func publishKeyed(t *testing.T, addr string, keys, perKey, pubs int, between func(round int)) {
	t.Helper()
	var wg sync.WaitGroup
	rounds := make([]chan struct{}, perKey)
	for i := range rounds {
		rounds[i] = make(chan struct{})
	}
	errs := make(chan error, pubs)
	for p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pub, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: fmt.Sprintf("pub-%d", p), CleanStart: true, KeepAlive: 30})
			if err != nil {
				errs <- err
				return
			}
			defer pub.Close()
			for s := range perKey {
				<-rounds[s]
				for k := p; k < keys; k += pubs {
					key := fmt.Sprintf("key-%04d", k)
					pr, err := pub.Client.Publish(t.Context(), &paho.Publish{Topic: "orders/" + key, QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", key, s),
						Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
					if err != nil || pr.ReasonCode != 0 {
						errs <- fmt.Errorf("publisher %d: %v (reason %v)", p, err, pr)
						return
					}
				}
			}
		}()
	}
	for s := range perKey {
		if between != nil {
			between(s)
		}
		close(rounds[s])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestKeySharedOrderAndParallelism: 8 MQTT 5 members, 1,000 keys, 50,000 QoS
// 1 messages: zero order violations, zero loss, zero duplicates, each key on
// one member, and every member busy.
func TestKeySharedOrderAndParallelism(t *testing.T) {
	const members, keys, perKey, pubs = 8, 1000, 50, 10
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	l := newLedger()
	for i := range members {
		addMember(t, addr, fmt.Sprintf("worker-%d", i), "$share/billing/orders/#", l)
	}
	start := time.Now()
	publishKeyed(t, addr, keys, perKey, pubs, nil)
	l.waitComplete(t, keys, perKey, 2*time.Minute)
	elapsed := time.Since(start)
	if dups := l.check(t, keys, perKey, nil); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
	perMember := map[string]int{}
	l.mu.Lock()
	for key, s := range l.byKey {
		for _, d := range s {
			if d.member != s[0].member {
				t.Fatalf("key %s delivered to %s and %s with no membership change", key, s[0].member, d.member)
			}
		}
		perMember[s[0].member] += len(s)
	}
	total := l.total
	l.mu.Unlock()
	if len(perMember) != members {
		t.Errorf("messages reached %d of %d members: %v", len(perMember), members, perMember)
	}
	t.Logf("%d messages over %d keys to %d members in %v (%.0f msgs/s end to end): %v",
		total, keys, members, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), perMember)
}

// TestKeySharedChurn: while publishing goes on, members join, leave
// gracefully and vanish (TCP closed without DISCONNECT): zero order
// violations and zero loss; duplicates only for messages in flight at a
// member when it left (a graceful leaver may have received a message whose
// PUBACK it never sent).
func TestKeySharedChurn(t *testing.T) {
	const keys, perKey, pubs = 300, 30, 6
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	l := newLedger()
	filter := "$share/churn/orders/#"
	active := []*member{}
	for i := range 4 {
		active = append(active, addMember(t, addr, fmt.Sprintf("m-%d", i), filter, l))
	}
	departed := map[string]bool{} // members that left or vanished
	vanished := 0
	next := 4
	start := time.Now()
	publishKeyed(t, addr, keys, perKey, pubs, func(round int) {
		switch round % 6 {
		case 2: // a new member joins
			active = append(active, addMember(t, addr, fmt.Sprintf("m-%d", next), filter, l))
			next++
		case 3: // the oldest leaves gracefully; a message it received but had not
			// acknowledged yet when it left is in flight and comes again
			departed[active[0].id] = true
			active[0].stop()
			active = active[1:]
		case 5: // one vanishes
			victim := active[len(active)/2]
			departed[victim.id] = true
			vanished++
			victim.vanish()
			active = append(active[:len(active)/2], active[len(active)/2+1:]...)
		}
		if round%6 == 0 && len(active) < 3 {
			active = append(active, addMember(t, addr, fmt.Sprintf("m-%d", next), filter, l))
			next++
		}
	})
	l.waitComplete(t, keys, perKey, 2*time.Minute)
	dups := l.check(t, keys, perKey, departed)
	t.Logf("%d messages, %d members joined, %d left, %d of them vanished: %d redelivered after their member left, %v",
		keys*perKey, next, len(departed), vanished, dups, time.Since(start).Round(time.Millisecond))
}
