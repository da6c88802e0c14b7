package keyshared

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// chanDeliverer passes deliveries to the test over a channel; it is safe for
// the loop goroutine and the test to share.
type chanDeliverer struct {
	c       chan delivery
	mu      sync.Mutex
	refuse  map[string]bool
	revoked []delivery
}

func newChanDeliverer() *chanDeliverer {
	return &chanDeliverer{c: make(chan delivery, 10000), refuse: make(map[string]bool)}
}

func (d *chanDeliverer) Deliver(member string, m *Message, attempt int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse[member] {
		return false
	}
	d.c <- delivery{member: member, offset: m.Offset, key: m.Key, attempt: attempt}
	return true
}

func (d *chanDeliverer) Revoke(member string, offset uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.revoked = append(d.revoked, delivery{member: member, offset: offset})
}

// next waits for the next delivery.
func (d *chanDeliverer) next(t *testing.T) delivery {
	t.Helper()
	select {
	case x := <-d.c:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
		return delivery{}
	}
}

// none checks that nothing was delivered. The caller has synchronised with the
// loop (Flush), so anything delivered would be in the channel already.
func (d *chanDeliverer) none(t *testing.T) {
	t.Helper()
	select {
	case x := <-d.c:
		t.Fatalf("unexpected delivery %+v", x)
	default:
	}
}

type loopHarness struct {
	t *testing.T
	// broken holds the first invariant violation the loop found.
	broken atomic.Pointer[error]
	clock  *fakeClock
	log    *memLog
	out    *chanDeliverer
	d      *Dispatcher
}

func newLoop(t *testing.T, mod func(*Config)) *loopHarness {
	t.Helper()
	h := &loopHarness{t: t, clock: newFakeClock(), log: newMemLog(), out: newChanDeliverer()}
	cfg := DefaultConfig()
	cfg.Group = "loop"
	cfg.Clock = h.clock
	cfg.Logger = testLogger(t)
	if mod != nil {
		mod(&cfg)
	}
	d, err := start(cfg, h.log, h.out, func(c *core) {
		if err := c.checkInvariants(); err != nil {
			h.broken.CompareAndSwap(nil, &err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	t.Cleanup(func() { h.close() })
	return h
}

func (h *loopHarness) close() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.d.Close(ctx); err != nil {
		h.t.Fatal(err)
	}
	if err := h.broken.Load(); err != nil {
		h.t.Fatalf("invariants broken on the loop: %v", *err)
	}
}

// sync waits until the loop has applied everything sent before.
func (h *loopHarness) sync() {
	h.t.Helper()
	if err := h.d.Flush(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

func TestDispatcherDeliversInKeyOrderAndPersists(t *testing.T) {
	h := newLoop(t, nil)
	for _, id := range []string{"a", "b", "c"} {
		if err := h.d.AddMember(id, MemberOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const n, keys = 300, 10
	for i := range n {
		h.log.append(fmt.Sprint("key-", i%keys), time.Time{})
	}
	h.d.Notify()
	lastOf := make(map[string]uint64)
	inflight := make(map[string]bool)
	owner := make(map[string]string)
	for range n {
		x := h.out.next(t)
		if inflight[x.key] {
			t.Fatalf("key %s: offset %d delivered while another is in flight", x.key, x.offset)
		}
		if x.offset <= lastOf[x.key] {
			t.Fatalf("key %s: offset %d after %d", x.key, x.offset, lastOf[x.key])
		}
		if o, ok := owner[x.key]; ok && o != x.member {
			t.Fatalf("key %s moved from %s to %s without a membership change", x.key, o, x.member)
		}
		lastOf[x.key], owner[x.key] = x.offset, x.member
		// Ack from the member's goroutine: here, this one.
		if err := h.d.Ack(x.member, x.offset); err != nil {
			t.Fatal(err)
		}
	}
	h.sync()
	s := h.d.Stats()
	if s.Acked != n || s.Cursor != n || h.log.persisted() != n || s.InFlight != 0 || s.Backlog != 0 {
		t.Fatalf("stats %+v, persisted %d", s, h.log.persisted())
	}
	if len(s.PerMember) != 3 || s.Members != 3 {
		t.Fatalf("members %+v", s.PerMember)
	}
}

func TestDispatcherHeartbeatTimeoutsAndEviction(t *testing.T) {
	h := newLoop(t, func(c *Config) { c.AckTimeout = 2 * time.Second; c.RetryBackoffBase = 0; c.RetryBackoffMax = 0 })
	if err := h.d.AddMember("a", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	h.log.append("k", time.Time{})
	h.d.Notify()
	first := h.out.next(t)
	h.clock.Advance(1500 * time.Millisecond)
	h.sync()
	h.out.none(t)
	h.clock.Advance(500 * time.Millisecond)
	h.sync()
	again := h.out.next(t)
	if again.offset != first.offset || again.attempt != 2 {
		t.Fatalf("after timeout %+v, first %+v", again, first)
	}
	if s := h.d.Stats(); s.Timeouts != 1 || s.Members != 1 || s.Evictions != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestDispatcherEvictsAfterSixHeartbeats(t *testing.T) {
	h := newLoop(t, nil)
	if err := h.d.AddMember("a", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	h.log.append("k", time.Time{})
	h.d.Notify()
	first := h.out.next(t)
	// Disconnect: evicted after 6 heartbeats (3 s), the message requeued.
	if err := h.d.SetActive("a", false); err != nil {
		t.Fatal(err)
	}
	if err := h.d.AddMember("b", MemberOptions{KeyFilters: []string{"nothing-*"}}); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(2500 * time.Millisecond)
	h.sync()
	if s := h.d.Stats(); s.Members != 2 || s.Evictions != 0 {
		t.Fatalf("evicted too early: %+v", s)
	}
	if err := h.d.AddMember("c", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(500 * time.Millisecond)
	h.sync()
	if s := h.d.Stats(); s.Members != 2 || s.Evictions != 1 || s.MemberLosses != 1 {
		t.Fatalf("not evicted after 6 heartbeats: %+v", s)
	}
	x := h.out.next(t)
	if x.member != "c" || x.offset != first.offset {
		t.Fatalf("requeued delivery %+v", x)
	}
	if err := h.d.SetActive("a", true); !errors.Is(err, ErrUnknownMember) {
		t.Fatalf("SetActive after eviction: %v", err)
	}
}

func TestDispatcherNotifyNeverBlocks(t *testing.T) {
	h := newLoop(t, nil)
	if err := h.d.AddMember("a", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	// Hold the loop inside Deliver while publishers notify and members ack.
	h.out.mu.Lock()
	h.log.append("k", time.Time{})
	h.d.Notify()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				h.d.Notify()
				_ = h.d.Ack("a", uint64(1_000_000+g*1000+i)) // stale on purpose
			}
		}()
	}
	wg.Wait() // returns although the loop is stuck
	h.out.mu.Unlock()
	x := h.out.next(t)
	if x.offset != 1 {
		t.Fatalf("delivery %+v", x)
	}
	h.sync()
	if s := h.d.Stats(); s.StaleAcks != 8000 {
		t.Fatalf("stale acks %d, want 8000", s.StaleAcks)
	}
}

func TestDispatcherInstantAcksFromDeliver(t *testing.T) {
	log := newMemLog()
	for i := range 5000 {
		log.append(fmt.Sprint("k", i%50), time.Time{})
	}
	out := &instantAcker{}
	cfg := DefaultConfig()
	cfg.Clock = newFakeClock()
	d, err := New(cfg, log, out)
	if err != nil {
		t.Fatal(err)
	}
	out.d = d
	if err := d.AddMember("a", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	for d.Stats().Acked < 5000 {
		if err := d.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if log.persisted() != 5000 {
		t.Fatalf("persisted %d", log.persisted())
	}
	if err := d.Ack("a", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ack after Close: %v", err)
	}
	if err := d.AddMember("b", MemberOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("AddMember after Close: %v", err)
	}
}

// instantAcker acks every delivery from inside Deliver, on the loop goroutine.
type instantAcker struct {
	d *Dispatcher
	n int
}

func (a *instantAcker) Deliver(member string, m *Message, attempt int) bool {
	a.n++
	return a.d.Ack(member, m.Offset) == nil
}

func (a *instantAcker) Revoke(string, uint64) {}

func TestDispatcherCloseFlushesCursorAndStatsReadConcurrently(t *testing.T) {
	h := newLoop(t, nil)
	if err := h.d.AddMember("a", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		h.log.append(fmt.Sprint("k", i), time.Time{})
	}
	h.d.Notify()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a metrics scraper
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				_ = h.d.Stats()
			}
		}
	}()
	for range 50 {
		x := h.out.next(t)
		if err := h.d.Ack(x.member, x.offset); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	h.close()
	if h.log.persisted() != 50 {
		t.Fatalf("after Close the log's cursor is %d, want 50", h.log.persisted())
	}
	if s := h.d.Stats(); s.Cursor != 50 {
		t.Fatalf("stats %+v", s)
	}
}

func TestDispatcherRejectsBadInput(t *testing.T) {
	h := newLoop(t, nil)
	if err := h.d.AddMember("a", MemberOptions{KeyFilters: []string{"ok", ""}}); !errors.Is(err, ErrInvalidFilter) {
		t.Fatalf("empty filter: %v", err)
	}
	if err := h.d.AddMember("", MemberOptions{}); !errors.Is(err, ErrInvalidMember) {
		t.Fatalf("empty id: %v", err)
	}
	if err := h.d.RemoveMember("a"); !errors.Is(err, ErrUnknownMember) {
		t.Fatalf("unknown member: %v", err)
	}
	cfg := DefaultConfig()
	cfg.Window = 0
	if _, err := New(cfg, h.log, h.out); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad config: %v", err)
	}
}

func TestDispatcherRemoveMemberRequeuesAtOnce(t *testing.T) {
	h := newLoop(t, nil)
	if err := h.d.AddMember("a", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	h.log.append("k", time.Time{})
	h.log.append("k", time.Time{})
	h.d.Notify()
	x := h.out.next(t)
	if err := h.d.AddMember("b", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.d.RemoveMember("a"); err != nil {
		t.Fatal(err)
	}
	y := h.out.next(t)
	if y.member != "b" || y.offset != x.offset || y.attempt != 2 {
		t.Fatalf("requeued %+v after %+v", y, x)
	}
	h.out.mu.Lock()
	revoked := append([]delivery(nil), h.out.revoked...)
	h.out.mu.Unlock()
	if len(revoked) != 1 || revoked[0].member != "a" {
		t.Fatalf("revoked %+v", revoked)
	}
	if err := h.d.Nack("b", y.offset, 0x80); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Reject("b", y.offset, ReasonNotAuthorized); err != nil { // stale now
		t.Fatal(err)
	}
	h.sync()
	if s := h.d.Stats(); s.Nacks != 1 || s.StaleAcks != 1 || s.MemberLosses != 1 {
		t.Fatalf("stats %+v", s)
	}
}
