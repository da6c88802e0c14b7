package keyshared

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// harness drives a core directly, checking invariants after every call.
type harness struct {
	t   *testing.T
	cfg Config
	c   *core
	log *memLog
	out *recDeliverer
	now time.Time
}

func newHarness(t *testing.T, mod func(*Config)) *harness {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Group = "g"
	cfg.Logger = testLogger(t)
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, cfg: cfg, log: newMemLog(), out: newRecDeliverer(), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.restart()
	return h
}

// restart replaces the core by a new one over the same log, as after a crash.
func (h *harness) restart() {
	h.t.Helper()
	h.c = newCore(h.cfg, h.log, h.out)
	if err := h.c.open(); err != nil {
		h.t.Fatal(err)
	}
	h.c.poll(h.now)
	h.check()
}

// check hands resolutions to the log as the loop does after every batch,
// then checks the invariants.
func (h *harness) check() {
	h.t.Helper()
	if err := h.c.checkInvariants(); err != nil {
		h.t.Fatal(err)
	}
	h.c.flushResolved()
}

func (h *harness) publish(keys ...string) []uint64 {
	h.t.Helper()
	var offs []uint64
	for _, k := range keys {
		offs = append(offs, h.log.append(k, time.Time{}))
	}
	h.c.poll(h.now)
	h.check()
	return offs
}

func (h *harness) add(id string, recvMax int, filters ...string) {
	h.t.Helper()
	fs, err := compileFilters(filters)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.c.addMember(id, memberSpec{recvMax: recvMax, filters: fs}, h.now); err != nil {
		h.t.Fatal(err)
	}
	h.c.poll(h.now) // as the loop does after every command
	h.check()
}

func (h *harness) ack(member string, off uint64) {
	h.t.Helper()
	h.c.ack(member, off, h.now)
	h.check()
}

func (h *harness) nack(member string, off uint64, reason byte) {
	h.t.Helper()
	h.c.nack(member, off, reason, h.now)
	h.check()
}

// tick advances time by n heartbeats, running each.
func (h *harness) tick(n int) {
	h.t.Helper()
	for range n {
		h.now = h.now.Add(h.cfg.Heartbeat)
		h.c.tick(h.now)
		h.check()
	}
}

// offsets returns the offsets of ds.
func offsets(ds []delivery) []uint64 {
	var o []uint64
	for _, d := range ds {
		o = append(o, d.offset)
	}
	return o
}

func wantOffsets(t *testing.T, what string, got []delivery, want ...uint64) {
	t.Helper()
	if g := offsets(got); !slices.Equal(g, want) {
		t.Fatalf("%s: delivered %v, want %v (%+v)", what, g, want, got)
	}
}

func TestOneInFlightPerKeyInLogOrder(t *testing.T) {
	h := newHarness(t, nil)
	h.add("a", 0)
	offs := h.publish("k", "k", "k", "j")
	wantOffsets(t, "first", h.out.take(), offs[0], offs[3])
	h.ack("a", offs[0])
	wantOffsets(t, "after ack", h.out.take(), offs[1])
	h.ack("a", offs[2])
	h.ack("a", offs[1])
	wantOffsets(t, "after acks", h.out.take(), offs[2])
	if h.c.st.staleAcks != 1 {
		t.Fatalf("ack of an undelivered offset: stale acks %d, want 1", h.c.st.staleAcks)
	}
}

func TestCursorWaitsForOutOfOrderAcks(t *testing.T) {
	h := newHarness(t, nil)
	for range 9 {
		h.log.append("old", time.Time{})
	}
	h.log.setFloor(9) // offsets 1..9 resolved earlier
	h.restart()
	h.add("a", 0)
	offs := h.publish("k10", "k11", "k12", "k13")
	if offs[0] != 10 {
		t.Fatalf("first offset %d", offs[0])
	}
	h.ack("a", 10)
	h.ack("a", 12)
	h.ack("a", 13)
	if cur := h.c.cursor(); cur != 10 {
		t.Fatalf("cursor %d with 11 in flight, want 10", cur)
	}
	h.ack("a", 11)
	if cur := h.c.cursor(); cur != 13 {
		t.Fatalf("cursor %d after all acks, want 13", cur)
	}
	if h.log.persisted() != 13 {
		t.Fatalf("log cursor %d, want 13", h.log.persisted())
	}
}

func TestMemberLimitFollowsReceiveMaximum(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MemberMaxInflight = 3 })
	h.add("a", 2)
	offs := h.publish("k1", "k2", "k3", "k4", "k5")
	wantOffsets(t, "limit 2", h.out.take(), offs[0], offs[1])
	if s := h.c.stats(); s.MembersAtLimit != 1 || s.InFlight != 2 || s.Blocked != 3 || s.BlockedKeys != 3 {
		t.Fatalf("stats %+v", s)
	}
	h.ack("a", offs[1])
	wantOffsets(t, "freed one", h.out.take(), offs[2])
	h.add("a", 0) // re-subscribe without Receive Maximum: config limit 3
	wantOffsets(t, "limit 3", h.out.take(), offs[3])
}

func TestWindowStopsReadingWhenFull(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Window = 4; c.ReadBatch = 3 })
	h.add("a", 0)
	var offs []uint64
	for i := range 10 {
		offs = append(offs, h.log.append(fmt.Sprint("k", i%2), time.Time{}))
	}
	h.c.poll(h.now)
	h.check()
	if h.c.w.count != 4 || h.c.lastRead != 4 {
		t.Fatalf("window %d, last read %d; want 4, 4", h.c.w.count, h.c.lastRead)
	}
	if s := h.c.stats(); s.Lag != 6 || s.Backlog != 10 {
		t.Fatalf("lag %d backlog %d", s.Lag, s.Backlog)
	}
	wantOffsets(t, "full window", h.out.take(), 1, 2)
	h.ack("a", 1)
	h.c.poll(h.now)
	h.check()
	if h.c.lastRead != 5 {
		t.Fatalf("read up to %d after one ack, want 5", h.c.lastRead)
	}
	wantOffsets(t, "next of k0", h.out.take(), 3)
}

func TestNackRetriesWithBackoffThenPoison(t *testing.T) {
	for _, policy := range []PoisonPolicy{PoisonDeadLetter, PoisonDrop, PoisonBlock} {
		t.Run(policy.String(), func(t *testing.T) {
			h := newHarness(t, func(c *Config) {
				c.MaxDeliveries = 3
				c.RetryBackoffBase = time.Second
				c.RetryBackoffMax = 1500 * time.Millisecond
				c.Poison = policy
			})
			h.add("a", 0)
			offs := h.publish("k", "k", "j")
			wantOffsets(t, "first", h.out.take(), offs[0], offs[2])
			h.nack("a", offs[0], 0x80)
			h.tick(1)
			wantOffsets(t, "500ms into 1s backoff", h.out.take())
			h.tick(1)
			got := h.out.take()
			wantOffsets(t, "after 1s", got, offs[0])
			if got[0].attempt != 2 {
				t.Fatalf("attempt %d, want 2", got[0].attempt)
			}
			h.nack("a", offs[0], 0x80)
			h.tick(2)
			wantOffsets(t, "1s into capped 1.5s backoff", h.out.take())
			h.tick(1)
			wantOffsets(t, "after 1.5s", h.out.take(), offs[0])
			h.ack("a", offs[2]) // other keys go on meanwhile
			h.nack("a", offs[0], 0x83)
			s := h.c.stats()
			switch policy {
			case PoisonDeadLetter:
				dl := h.log.deadLetters()
				if len(dl) != 1 || dl[0].Message.Offset != offs[0] || dl[0].Attempts != 3 || dl[0].Reason != 0x83 || dl[0].Group != "g" {
					t.Fatalf("dead letters %+v", dl)
				}
				wantOffsets(t, "next after dead letter", h.out.take(), offs[1])
				if s.DeadLettered != 1 {
					t.Fatalf("stats %+v", s)
				}
			case PoisonDrop:
				wantOffsets(t, "next after drop", h.out.take(), offs[1])
				if s.Dropped != 1 || len(h.log.deadLetters()) != 0 {
					t.Fatalf("stats %+v", s)
				}
			case PoisonBlock:
				h.tick(10)
				wantOffsets(t, "blocked key", h.out.take())
				if s.PoisonedKeys != 1 || h.c.cursor() != offs[0]-1 {
					t.Fatalf("stats %+v cursor %d", s, h.c.cursor())
				}
				h.ack("a", offs[0]) // a late ack still resolves it
				wantOffsets(t, "after late ack", h.out.take(), offs[1])
			}
			if s.Nacks != 3 || s.Redeliveries != 2 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

func TestRejectDeadLettersAtOnce(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Poison = PoisonDrop })
	h.add("a", 0)
	offs := h.publish("k", "k", "k")
	h.c.reject("a", offs[0], 0x87, h.now)
	h.check()
	wantOffsets(t, "after reject", h.out.take(), offs[0], offs[1])
	h.nack("a", offs[1], ReasonPayloadFormatInvalid) // a never-retry nack is a reject
	wantOffsets(t, "after 0x99", h.out.take(), offs[2])
	dl := h.log.deadLetters()
	if len(dl) != 2 || dl[0].Reason != 0x87 || dl[1].Reason != 0x99 || dl[1].Attempts != 1 {
		t.Fatalf("dead letters %+v", dl)
	}
	if s := h.c.stats(); s.Rejects != 2 || s.DeadLettered != 2 || s.Nacks != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAckTimeoutRetriesWithoutEviction(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.AckTimeout = 2 * time.Second; c.RetryBackoffBase = 0; c.RetryBackoffMax = 0 })
	h.add("a", 0)
	offs := h.publish("k")
	h.out.take()
	h.tick(3)
	wantOffsets(t, "before timeout", h.out.take())
	h.tick(1)
	got := h.out.take()
	wantOffsets(t, "after timeout", got, offs[0])
	if len(h.out.revoked) != 1 || h.out.revoked[0].offset != offs[0] || h.out.revoked[0].member != "a" {
		t.Fatalf("revoked %+v", h.out.revoked)
	}
	if _, ok := h.c.members["a"]; !ok || h.c.st.timeouts != 1 || h.c.st.evictions != 0 {
		t.Fatalf("member gone or stats wrong: %+v", h.c.stats())
	}
	h.ack("a", offs[0])
	if h.c.cursor() != offs[0] {
		t.Fatalf("cursor %d", h.c.cursor())
	}
}

func TestEvictionRequeuesInKeyOrder(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxDeliveries = 3 })
	h.add("a", 0)
	offs := h.publish("k", "k", "j")
	wantOffsets(t, "first", h.out.take(), offs[0], offs[2])
	if err := h.c.setActive("a", false, h.now); err != nil {
		t.Fatal(err)
	}
	h.check()
	h.add("b", 0, "nothing-matches-these")
	h.tick(5)
	if _, ok := h.c.members["a"]; !ok {
		t.Fatal("evicted after 5 heartbeats")
	}
	h.add("c", 0)
	wantOffsets(t, "keys wait for their member", h.out.take())
	h.tick(1)
	if _, ok := h.c.members["a"]; ok {
		t.Fatal("not evicted after 6 heartbeats")
	}
	got := h.out.take()
	slices.SortFunc(got, func(x, y delivery) int { return int(x.offset) - int(y.offset) })
	wantOffsets(t, "requeued", got, offs[0], offs[2])
	for _, d := range got {
		if d.member != "c" {
			t.Fatalf("requeued to %q", d.member)
		}
	}
	if h.c.w.byOffset.get(offs[0]).attempts != 1 || len(h.out.revoked) != 2 || h.c.st.evictions != 1 || h.c.st.losses != 2 {
		t.Fatalf("attempts %d revoked %v stats %+v", h.c.w.byOffset.get(offs[0]).attempts, h.out.revoked, h.c.stats())
	}
	if h.c.cursor() != 0 {
		t.Fatalf("cursor %d: lost messages were treated as acked", h.c.cursor())
	}
	h.ack("c", offs[0])
	wantOffsets(t, "next of k", h.out.take(), offs[1])
}

func TestMemberLossCountsAsAttempt(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxDeliveries = 2 })
	offs := h.publish("k")
	for i, id := range []string{"a", "b"} {
		h.add(id, 0)
		wantOffsets(t, id, h.out.take(), offs[0])
		if err := h.c.removeMember(id, false, h.now); err != nil {
			t.Fatal(err)
		}
		h.check()
		if i == 0 && len(h.log.deadLetters()) != 0 {
			t.Fatal("dead-lettered after one loss")
		}
	}
	if dl := h.log.deadLetters(); len(dl) != 1 || dl[0].Attempts != 2 || dl[0].Reason != 0 {
		t.Fatalf("a message that loses every member must end in the dead letters: %+v", dl)
	}
}

func TestMovedKeyWaitsForOldMember(t *testing.T) {
	h := newHarness(t, nil)
	h.add("a", 0)
	// Find a key that moves from a to b when b joins.
	key := ""
	for i := 0; key == ""; i++ {
		k := fmt.Sprint("key-", i)
		r := buildRing([]ringMember{{id: "a"}, {id: "b"}})
		if r.members[r.pick(k)].id == "b" {
			key = k
		}
	}
	offs := h.publish(key, key)
	wantOffsets(t, "on a", h.out.take(), offs[0])
	h.add("b", 0)
	wantOffsets(t, "moved key while its message is on a", h.out.take())
	h.ack("a", offs[0])
	got := h.out.take()
	wantOffsets(t, "after a acked", got, offs[1])
	if got[0].member != "b" {
		t.Fatalf("delivered to %q, want b", got[0].member)
	}
}

func TestExpiredAreSkippedAndUnmatchedWait(t *testing.T) {
	h := newHarness(t, nil)
	h.log.append("k", h.now.Add(-time.Second)) // expired before it is read
	h.log.append("k", h.now.Add(time.Second))  // expires while blocked
	h.log.append("other", time.Time{})         // no member takes it
	h.log.append("k", time.Time{})
	h.c.poll(h.now)
	h.check()
	if h.c.w.count != 0 {
		t.Fatalf("window %d; a group without members reads nothing", h.c.w.count)
	}
	h.now = h.now.Add(2 * time.Second)
	h.add("a", 0, "k")
	wantOffsets(t, "only k", h.out.take(), 4)
	h.ack("a", 4)
	// "other" is not skipped: it waits for a member that takes it.
	if s := h.c.stats(); s.Expired != 2 || s.UnroutableKeys != 1 || s.Cursor != 2 || s.Blocked != 1 {
		t.Fatalf("stats %+v", s)
	}
	h.add("b", 0, "o*")
	wantOffsets(t, "other, once b takes it", h.out.take(), 3)
	h.ack("b", 3)
	if s := h.c.stats(); s.UnroutableKeys != 0 || s.Cursor != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// TestIneligibleMembers: read access and the size a member can take work
// like a key filter: a message goes to an eligible member or waits; it is
// never offered to a member that may not read its topic or cannot take it
// (its Maximum Packet Size), and never dead-lettered for it (a message too
// large was, with 0x95, at the first attempt).
func TestIneligibleMembers(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec memberSpec // refuses the message of key (and topic) "denied"
	}{
		{"may not read", memberSpec{canRead: func(topic string) bool { return topic != "denied" }}},
		{"cannot take", memberSpec{fits: func(m *Message) bool { return m.Key != "denied" }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			if err := h.c.addMember("narrow", tc.spec, h.now); err != nil {
				t.Fatal(err)
			}
			h.c.poll(h.now)
			h.check()
			offs := h.publish("denied", "allowed")
			wantOffsets(t, "only the allowed one", h.out.take(), offs[1])
			if s := h.c.stats(); s.UnroutableKeys != 1 || len(h.log.deadLetters()) != 0 {
				t.Fatalf("stats %+v, dead letters %d", s, len(h.log.deadLetters()))
			}
			h.add("wide", 0)
			got := h.out.take()
			wantOffsets(t, "the denied one, once a member that takes it joins", got, offs[0])
			if got[0].member != "wide" {
				t.Fatalf("the denied one went to %q", got[0].member)
			}
		})
	}
}

func TestRefusedDeliveryIsNotAnAttempt(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxDeliveries = 1 })
	h.add("a", 0)
	h.out.refuse["a"] = true
	offs := h.publish("k", "j")
	if h.c.st.refused != 1 || len(h.out.got) != 0 {
		t.Fatalf("refused %d", h.c.st.refused)
	}
	h.tick(1) // retried on the heartbeat, refused again
	h.out.refuse["a"] = false
	h.tick(1)
	got := h.out.take()
	slices.SortFunc(got, func(x, y delivery) int { return int(x.offset) - int(y.offset) })
	wantOffsets(t, "after refusals", got, offs...)
	if got[0].attempt != 1 || len(h.log.deadLetters()) != 0 {
		t.Fatalf("refusals counted as attempts: %+v", got)
	}
}

func TestDeadLetterIsStoredBeforeCursorPasses(t *testing.T) {
	h := newHarness(t, nil)
	h.add("a", 0)
	offs := h.publish("k", "k")
	h.log.failDead = true
	h.c.reject("a", offs[0], 0x99, h.now)
	h.check()
	h.tick(2)
	if h.log.isResolved(offs[0]) || len(h.out.got) != 1 {
		t.Fatalf("offset %d resolved in the log before its dead letter was stored", offs[0])
	}
	h.log.failDead = false
	h.tick(1)
	if len(h.log.deadLetters()) != 1 {
		t.Fatal("dead letter not retried")
	}
	wantOffsets(t, "after stored", h.out.take(), offs[0], offs[1])
	if h.log.persisted() != offs[0] || h.c.st.storeErrors != 3 {
		t.Fatalf("persisted %d, store errors %d", h.log.persisted(), h.c.st.storeErrors)
	}
}

// TestResolutionsReachTheLogAfterEveryBatch: acks are handed to the log as
// they happen, out of order too, so a crash loses at most what the log had
// not committed.
func TestResolutionsReachTheLogAfterEveryBatch(t *testing.T) {
	h := newHarness(t, nil)
	h.add("a", 0)
	offs := h.publish("a", "b", "c")
	h.ack("a", offs[1]) // out of order: the cursor cannot pass offs[0]
	if !h.log.isResolved(offs[1]) || h.log.persisted() != 0 {
		t.Fatalf("log: offset %d resolved %v, cursor %d", offs[1], h.log.isResolved(offs[1]), h.log.persisted())
	}
	h.log.commit()
	h.ack("a", offs[0])
	h.log.crash() // offs[0]'s resolution was never committed
	h.restart()
	h.out.take()
	h.add("b", 0)
	// offs[1] was durably acked: only offs[0] and the unacked offs[2] come again.
	wantOffsets(t, "after the crash", h.out.take(), offs[0], offs[2])
}

func TestRestartRedeliversOnlyWhatWasNotResolved(t *testing.T) {
	h := newHarness(t, nil)
	h.add("a", 0)
	offs := h.publish("k", "k", "j", "k")
	h.ack("a", offs[0])
	h.ack("a", offs[2])
	h.log.commit()
	h.restart()
	h.out.take()
	h.add("b", 0)
	// offs[2] was acked out of order and stays acked; offs[1] comes again.
	wantOffsets(t, "after restart", h.out.take(), offs[1])
	h.ack("b", offs[1])
	wantOffsets(t, "then", h.out.take(), offs[3])
}

func TestNoMemberWaitsAndGapsPass(t *testing.T) {
	h := newHarness(t, nil)
	h.log.append("k", time.Time{})
	h.log.skip()
	h.log.skip()
	h.log.append("j", time.Time{})
	h.c.poll(h.now)
	h.check()
	h.tick(20)
	if h.c.w.count != 0 || h.c.cursor() != 0 {
		t.Fatal("messages read or skipped while the group had no member")
	}
	h.add("a", 0)
	h.ack("a", 1)
	if h.c.cursor() != 3 {
		t.Fatalf("cursor %d, want 3 (gap passed)", h.c.cursor())
	}
	h.ack("a", 4)
	if h.c.cursor() != 4 {
		t.Fatalf("cursor %d", h.c.cursor())
	}
}

func TestStaleAcksAreIgnored(t *testing.T) {
	h := newHarness(t, nil)
	h.add("a", 0)
	h.add("b", 0)
	offs := h.publish("k")
	d := h.out.take()[0]
	other := "a"
	if d.member == "a" {
		other = "b"
	}
	h.ack(other, offs[0])
	h.nack(other, offs[0], 0x80)
	h.ack(d.member, 999)
	if h.c.w.count != 1 || h.c.st.staleAcks != 3 {
		t.Fatalf("window %d stale %d", h.c.w.count, h.c.st.staleAcks)
	}
}

func TestMembershipErrors(t *testing.T) {
	h := newHarness(t, nil)
	if err := h.c.addMember("", memberSpec{}, h.now); !errors.Is(err, ErrInvalidMember) {
		t.Fatal(err)
	}
	if err := h.c.removeMember("x", false, h.now); !errors.Is(err, ErrUnknownMember) {
		t.Fatal(err)
	}
	if err := h.c.setActive("x", true, h.now); !errors.Is(err, ErrUnknownMember) {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"MaxDeliveries":     func(c *Config) { c.MaxDeliveries = 0 },
		"AckTimeout":        func(c *Config) { c.AckTimeout = 0 },
		"RetryBackoffMax":   func(c *Config) { c.RetryBackoffMax = c.RetryBackoffBase - 1 },
		"MemberMaxInflight": func(c *Config) { c.MemberMaxInflight = 0 },
		"Window":            func(c *Config) { c.Window = 0 },
		"Heartbeat":         func(c *Config) { c.Heartbeat = 0 },
		"Poison":            func(c *Config) { c.Poison = 9 },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := DefaultConfig()
	if c.backoff(1) != time.Second || c.backoff(3) != 4*time.Second || c.backoff(30) != time.Minute {
		t.Fatalf("backoff %v %v %v", c.backoff(1), c.backoff(3), c.backoff(30))
	}
	for _, p := range []PoisonPolicy{PoisonDeadLetter, PoisonDrop, PoisonBlock} {
		if q, err := ParsePoisonPolicy(p.String()); err != nil || q != p {
			t.Fatalf("%v: %v %v", p, q, err)
		}
	}
	if _, err := ParsePoisonPolicy("retry"); !errors.Is(err, ErrInvalidPoisonPolicy) {
		t.Fatal(err)
	}
}

func TestWindowStopsReadingAtItsByteBound(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.WindowBytes = 3 * 200 })
	h.add("a", 0)
	var offs []uint64
	for range 10 {
		offs = append(offs, h.log.append("k", time.Time{})) // one key: all but the first wait
	}
	h.c.poll(h.now)
	h.check()
	// Each message costs ~160+ bytes and its key 129: reading stops once 600
	// bytes are held.
	if s := h.c.stats(); h.c.w.count != 3 || s.WindowBytes < 600 || s.Lag != 7 {
		t.Fatalf("window %d messages, %d bytes, lag %d", h.c.w.count, s.WindowBytes, s.Lag)
	}
	for _, o := range offs {
		wantOffsets(t, "next", h.out.take(), o)
		h.ack("a", o)
		h.c.poll(h.now)
		h.check()
	}
	// The key stays idle (129 bytes, within a quarter of the bound).
	if s := h.c.stats(); s.Acked != 10 || s.WindowBytes != keyCost("k") {
		t.Fatalf("stats %+v", s)
	}
}

func TestUnorderedKeepsManyOfAKeyInFlight(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Unordered = true; c.MemberMaxInflight = 3 })
	h.add("a", 0)
	offs := h.publish("k", "k", "k", "k", "j")
	wantOffsets(t, "up to the member's limit, in log order", h.out.take(), offs[0], offs[1], offs[2])
	h.ack("a", offs[1])
	wantOffsets(t, "one freed", h.out.take(), offs[3])
	if cur := h.c.cursor(); cur != offs[0]-1 {
		t.Fatalf("cursor %d with %d unacked, want %d", cur, offs[0], offs[0]-1)
	}
	h.nack("a", offs[0], 0x80)
	wantOffsets(t, "nack frees a slot for the next in log order", h.out.take(), offs[4])
	h.ack("a", offs[2])
	h.ack("a", offs[3])
	h.ack("a", offs[4])
	h.tick(int(h.cfg.RetryBackoffBase/h.cfg.Heartbeat) + 1)
	got := h.out.take()
	wantOffsets(t, "the retry", got, offs[0])
	if got[0].attempt != 2 || got[0].key != "k" {
		t.Fatalf("retry %+v: want attempt 2 with the message's own key", got[0])
	}
	h.ack("a", offs[0])
	if cur := h.c.cursor(); cur != offs[4] {
		t.Fatalf("cursor %d after every ack, want %d", cur, offs[4])
	}
	if n := len(h.c.w.keys); n != 0 {
		t.Fatalf("%d queues left in the window: unordered keeps no idle ones", n)
	}
}

func TestLostMemberRequeuesInLogOrder(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Unordered = true })
	h.add("a", 0)
	offs := h.publish("k", "k", "k")
	wantOffsets(t, "all in flight", h.out.take(), offs...)
	if err := h.c.removeMember("a", false, h.now); err != nil {
		t.Fatal(err)
	}
	h.check()
	h.add("b", 0)
	wantOffsets(t, "requeued, then delivered to the next member in log order", h.out.take(), offs...)
}

// TestLostMemberRequeuesBeforeWaiting: an unordered group's messages that
// were in flight on a member that left go out again before those read later
// that waited for it (for room in its window, or after it refused one as its
// connection went), so the next member gets them all in log order. They went
// out last, behind the waiting ones: a bridge's pipelined rule sent a key's
// later messages before its earlier ones after the remote was killed
// (TestBridgeRemoteRestartUnderLoad, "97 after 99").
func TestLostMemberRequeuesBeforeWaiting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		// refuse makes the member refuse what comes after the first three,
		// as a bridge whose connection broke refuses deliveries until it
		// leaves the group.
		refuse bool
	}{
		{"window full", 3, false},
		{"refused", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) {
				c.Unordered = true
				if tc.limit > 0 {
					c.MemberMaxInflight = tc.limit
				}
			})
			h.add("a", 0)
			offs := h.publish("k", "k", "k")
			wantOffsets(t, "in flight", h.out.take(), offs...)
			h.out.refuse["a"] = tc.refuse
			offs = append(offs, h.publish("k", "j")...)
			if got := h.out.take(); len(got) != 0 {
				t.Fatalf("delivered %v to a member without room", offsets(got))
			}
			if err := h.c.removeMember("a", false, h.now); err != nil {
				t.Fatal(err)
			}
			h.check()
			h.out.refuse["a"] = false
			h.add("a", 0)
			got := h.out.take()
			wantOffsets(t, "after the member came back", got[:min(len(got), 3)], offs[:3]...)
			for _, off := range offs[:3] {
				h.ack("a", off)
			}
			got = append(got, h.out.take()...)
			wantOffsets(t, "all, in log order", got, offs...)
		})
	}
}

// TestIdleKeysAreBoundedInBytes: keys whose messages all resolved stay in
// the window for a while (so that a key coming back costs no map churn), but
// they count against WindowBytes, take at most a quarter of it, and never
// keep the dispatcher from reading.
func TestIdleKeysAreBoundedInBytes(t *testing.T) {
	const bound = 8 << 10
	h := newHarness(t, func(c *Config) { c.WindowBytes = bound })
	h.add("a", 0)
	key := func(i int) string { return fmt.Sprintf("%0100d", i) } // 100-byte keys
	for i := range 1000 {
		off := h.log.append(key(i), time.Time{})
		h.c.poll(h.now)
		wantOffsets(t, "next", h.out.take(), off)
		h.ack("a", off)
		h.check()
	}
	s := h.c.stats()
	if idle := h.c.w.idleBytes; idle > bound/4 || s.WindowBytes != idle || h.c.w.idle.n != int(idle/keyCost(key(0))) {
		t.Fatalf("idle keys: %d of them, %d bytes (bound %d); window %d bytes", h.c.w.idle.n, idle, bound/4, s.WindowBytes)
	}
	t.Logf("1000 keys of 100 bytes seen: %d idle kept, %d bytes, bound %d", h.c.w.idle.n, h.c.w.idleBytes, bound/4)
}
