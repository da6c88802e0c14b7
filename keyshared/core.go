package keyshared

import (
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// outcome is how a message of the log was resolved for the group.
type outcome uint8

const (
	outAcked outcome = iota + 1
	outDeadLettered
	outDropped
	outExpired
)

func (o outcome) String() string {
	switch o {
	case outAcked:
		return "acked"
	case outDeadLettered:
		return "dead-lettered"
	case outDropped:
		return "dropped"
	case outExpired:
		return "expired"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// counters are the monotonically increasing totals Stats reports.
type counters struct {
	delivered, redeliveries, acked, nacks, rejects, timeouts, losses uint64
	deadLettered, dropped, expired, evictions, refused, staleAcks    uint64
	storeErrors                                                      uint64
}

// core is the dispatcher state of one group. It is a plain state machine:
// every method takes the current time as a parameter and runs to completion,
// it starts no goroutine and takes no lock. The Dispatcher's loop goroutine
// owns it; the model tests drive it directly.
type core struct {
	cfg    Config
	log    Log
	out    Deliverer
	logger *slog.Logger

	w window

	// members holds every live member. Invariant 4: each key maps to exactly
	// one of them, through ring.
	members map[string]*member
	ring    *ring
	// byRing[i] is the member of ring.members[i] (sorted by id); it is also
	// the deterministic order in which members are visited.
	byRing []*member
	// noMember holds keys that wait because the group has no member at all.
	noMember keyList
	// noEligible holds keys whose head no member may take (key filters, ACL):
	// they wait for one that may, rather than being skipped.
	noEligible keyList
	// dlqPending holds entries whose dead letter the store failed to record.
	dlqPending []*entry
	// atLimit counts members with inflight >= limit.
	atLimit int

	// nextRead is the next offset to ask the log for; it only grows.
	nextRead uint64
	// lastRead is the highest offset read from the log (or the loaded cursor).
	// Every offset <= lastRead is resolved or in the window.
	lastRead uint64
	// head is the log head as last seen.
	head uint64
	// avgSize is a moving average of the size (Message.Size) of messages
	// read, to size reads to the window's byte bound.
	avgSize int64
	// resolved collects the offsets resolved since the log last heard of
	// them; flushResolved hands them over (invariant 3: the log records an
	// offset as resolved only once the dispatcher resolved it).
	resolved []uint64

	st counters

	buf     []Message
	scratch []*keyState
	// dirty lists members whose published stats are stale.
	dirty          []*member
	membersChanged bool

	// onResolve, when set (tests), hears of every message resolution.
	onResolve func(m *Message, out outcome, now time.Time)
}

func newCore(cfg Config, log Log, out Deliverer) *core {
	return &core{
		cfg:     cfg,
		log:     log,
		out:     out,
		logger:  cfg.logger(),
		w:       newWindow(cfg.Window, cfg.WindowBytes, cfg.Unordered),
		avgSize: 1024,
		members: make(map[string]*member),
		ring:    buildRing(nil),
	}
}

// open loads the persisted cursor: reading resumes right after it.
func (c *core) open() error {
	cur, err := c.log.LoadCursor()
	if err != nil {
		return fmt.Errorf("keyshared: load cursor: %w", err)
	}
	c.nextRead, c.lastRead = cur+1, cur
	c.head = c.log.Head()
	return nil
}

// cursor is the safe cursor: the highest offset such that it and every offset
// below it are resolved. It never decreases.
func (c *core) cursor() uint64 {
	if e := c.w.order.head; e != nil {
		return e.msg.Offset - 1
	}
	return c.lastRead
}

// pick returns the member that m goes to: the first eligible one clockwise
// from its key's point (key filters and read access decide), or nil.
func (c *core) pick(m *Message) *member {
	i := c.ring.pickMessage(m)
	if i < 0 {
		return nil
	}
	return c.byRing[i]
}

// route offers the head of ks to its member: it delivers it, parks the key
// on a wait list (its member's, or the group's lists of keys without a member
// or without an eligible one), or resolves a head that expired and goes on
// with the next. A key already on a wait list, or whose head is in flight,
// waits for retry or is poisoned, is left alone.
func (c *core) route(ks *keyState, now time.Time) {
	for {
		e := ks.head
		if e == nil {
			c.w.releaseKey(ks)
			return
		}
		if e.state != entryWaiting || ks.list != nil {
			return
		}
		if e.msg.Expired(now) {
			c.resolve(e, outExpired, now)
			continue
		}
		m := c.pick(&e.msg)
		if m == nil {
			if len(c.members) == 0 {
				c.noMember.push(ks)
			} else {
				c.noEligible.push(ks)
			}
			c.w.markKey(ks)
			return
		}
		if m.canTake() && c.deliver(e, m, now) {
			c.w.markKey(ks)
			return
		}
		m.waitq.push(ks)
		c.w.markKey(ks)
		return
	}
}

// deliver hands e to m. When m refuses it, m is paused and e stays waiting.
func (c *core) deliver(e *entry, m *member, now time.Time) bool {
	attempt := e.deliveries + 1
	if !c.out.Deliver(m.id, &e.msg, attempt) {
		c.st.refused++
		m.paused = true
		return false
	}
	e.deliveries = attempt
	if attempt > 1 {
		c.st.redeliveries++
	}
	c.st.delivered++
	e.state = entryInflight
	e.holder = m
	e.lastMember = m.id
	if e.firstDelivery.IsZero() {
		e.firstDelivery = now
	}
	e.lastDelivery = now
	e.deadline = now.Add(c.cfg.AckTimeout)
	c.w.deadlines.push(e)
	m.infl.push(e)
	m.inflight++
	c.w.inflight++
	c.memberChanged(m)
	return true
}

// endInflight takes e out of flight and returns the member it was on.
func (c *core) endInflight(e *entry) *member {
	m := e.holder
	c.w.deadlines.remove(e)
	m.infl.remove(e)
	m.inflight--
	c.w.inflight--
	e.holder = nil
	e.state = entryWaiting
	c.memberChanged(m)
	return m
}

func (c *core) memberChanged(m *member) {
	full := m.inflight >= m.limit && !m.removed
	if full != m.full {
		m.full = full
		if full {
			c.atLimit++
		} else {
			c.atLimit--
		}
	}
	if !m.dirty {
		m.dirty = true
		c.dirty = append(c.dirty, m)
	}
}

// resolve takes e, the head of its key and not in flight, out of the window
// for good. The caller routes the key's next message (finish does both).
func (c *core) resolve(e *entry, out outcome, now time.Time) {
	ks := e.ks
	switch e.state {
	case entryRetry:
		c.w.retries.remove(e)
	case entryPoisoned:
		c.w.poisoned--
	case entryDLQPending:
		if i := slices.Index(c.dlqPending, e); i >= 0 {
			c.dlqPending = slices.Delete(c.dlqPending, i, i+1)
		}
	}
	if ks.list != nil {
		ks.list.remove(ks)
	}
	switch out {
	case outAcked:
		c.st.acked++
	case outDeadLettered:
		c.st.deadLettered++
	case outDropped:
		c.st.dropped++
	case outExpired:
		c.st.expired++
	}
	if c.onResolve != nil {
		c.onResolve(&e.msg, out, now)
	}
	c.resolved = append(c.resolved, e.msg.Offset)
	c.w.removeHead(e)
}

// finish resolves e and routes the next message of its key.
func (c *core) finish(e *entry, out outcome, now time.Time) {
	ks := e.ks
	c.resolve(e, out, now)
	c.route(ks, now)
}

// serviceMember routes keys waiting for m while it can take messages.
func (c *core) serviceMember(m *member, now time.Time) {
	for m.canTake() {
		ks := m.waitq.pop()
		if ks == nil {
			return
		}
		c.route(ks, now)
	}
}

// ack resolves offset if member may ack it: it is in flight on member, or it
// waits for a retry (or is poisoned) after member had it last. Anything else
// is a stale ack and is only counted.
func (c *core) ack(member string, offset uint64, now time.Time) {
	e := c.w.byOffset.get(offset)
	if e == nil || e.ks.head != e {
		c.st.staleAcks++
		return
	}
	if e.state == entryInflight {
		if e.holder.id != member {
			c.st.staleAcks++
			return
		}
		m := c.endInflight(e)
		c.finish(e, outAcked, now)
		m.paused = false
		c.serviceMember(m, now)
		return
	}
	if e.lastMember == "" || e.lastMember != member {
		c.st.staleAcks++
		return
	}
	c.finish(e, outAcked, now)
}

// inflightOn returns the entry of offset if it is in flight on member.
func (c *core) inflightOn(member string, offset uint64) *entry {
	e := c.w.byOffset.get(offset)
	if e == nil || e.state != entryInflight || e.holder.id != member {
		return nil
	}
	return e
}

// nack counts a failed attempt and retries the message after backoff (or
// applies the poison policy). A never-retry reason code rejects it instead.
func (c *core) nack(member string, offset uint64, reason byte, now time.Time) {
	if NeverRetry(reason) {
		c.reject(member, offset, reason, now)
		return
	}
	e := c.inflightOn(member, offset)
	if e == nil {
		c.st.staleAcks++
		return
	}
	m := c.endInflight(e)
	c.st.nacks++
	e.attempts++
	e.lastReason = reason
	c.failed(e, now)
	m.paused = false
	c.serviceMember(m, now)
}

// returned takes back a delivery the member cannot take after all
// (Dispatcher.Return): the attempt is undone and the key routed again.
func (c *core) returned(member string, offset uint64, now time.Time) {
	e := c.inflightOn(member, offset)
	if e == nil {
		c.st.staleAcks++
		return
	}
	m := c.endInflight(e)
	if e.deliveries > 1 {
		c.st.redeliveries--
	}
	e.deliveries--
	if e.deliveries == 0 {
		e.firstDelivery = time.Time{}
	}
	c.st.delivered--
	c.st.refused++
	c.route(e.ks, now)
	c.serviceMember(m, now)
}

// reject dead-letters the message at once, whatever the poison policy.
func (c *core) reject(member string, offset uint64, reason byte, now time.Time) {
	e := c.inflightOn(member, offset)
	if e == nil {
		c.st.staleAcks++
		return
	}
	m := c.endInflight(e)
	c.st.rejects++
	e.attempts++
	e.lastReason = reason
	c.deadLetter(e, now)
	m.paused = false
	c.serviceMember(m, now)
}

// tick is the heartbeat: ack timeouts, poison handling, retries, eviction,
// lag-driven reading and debounced cursor persistence.
func (c *core) tick(now time.Time) {
	// Phase 1: ack timeouts. The member keeps its place; the message retries.
	for e := c.w.deadlines.head; e != nil && !now.Before(e.deadline); e = c.w.deadlines.head {
		m := c.endInflight(e)
		c.out.Revoke(m.id, e.msg.Offset)
		c.st.timeouts++
		e.attempts++
		e.lastReason = 0
		c.failed(e, now)
	}
	// Phase 2: poison handling: dead letters the store could not record yet.
	c.retryDeadLetters(now)
	// Phase 3: retries whose backoff elapsed.
	for e := c.w.retries.peek(); e != nil && !now.Before(e.retryAt); e = c.w.retries.peek() {
		c.w.retries.remove(e)
		e.state = entryWaiting
		c.route(e.ks, now)
	}
	// Phase 4: evict members inactive for EvictAfter ticks; give members that
	// refused a delivery another chance.
	var evict []string
	for _, m := range c.byRing {
		m.paused = false
		if !m.active {
			m.inactiveTicks++
			if m.inactiveTicks >= c.cfg.EvictAfter {
				evict = append(evict, m.id)
			}
		}
	}
	for _, id := range evict {
		_ = c.removeMember(id, true, now) // id was just found among members
	}
	for _, m := range c.byRing {
		c.serviceMember(m, now)
	}
	// Phase 5: lag-driven reading.
	c.poll(now)
}

// poll reads from the log while the window has room (in entries and bytes)
// and the log has more. A group without members reads nothing: its backlog
// stays on disk until a member joins.
func (c *core) poll(now time.Time) {
	if len(c.members) == 0 {
		return
	}
	c.w.makeRoom(c.cfg.WindowBytes)
	for c.w.count < c.cfg.Window && c.w.bytes < c.cfg.WindowBytes {
		c.head = max(c.head, c.log.Head())
		if c.nextRead > c.head {
			return
		}
		// Ask for what the byte bound leaves room for, at the sizes seen so far.
		room := (c.cfg.WindowBytes - c.w.bytes) / max(c.avgSize, 1)
		n := int(min(int64(c.cfg.ReadBatch), int64(c.cfg.Window-c.w.count), max(room, 1)))
		buf, err := c.log.ReadFrom(c.nextRead, n, c.buf[:0])
		if err != nil {
			c.st.storeErrors++
			c.logger.Error("keyshared: read from log", "from", c.nextRead, "error", err)
			return
		}
		full := false
		for i := range buf {
			m := &buf[i]
			if m.Offset < c.nextRead {
				continue // never read backwards
			}
			if c.w.bytes >= c.cfg.WindowBytes {
				full = true // the rest is read again once there is room
				break
			}
			size := int64(m.Size())
			c.avgSize += (size - c.avgSize) / 8
			c.nextRead = m.Offset + 1
			c.lastRead = m.Offset
			c.head = max(c.head, m.Offset)
			c.ingest(m, now)
		}
		got := len(buf)
		clear(buf)
		c.buf = buf[:0]
		if got < n || full {
			return
		}
	}
}

// ingest adds a message just read to the window and routes it when it heads
// its key. A message already expired is resolved on the spot.
func (c *core) ingest(m *Message, now time.Time) {
	if m.Expired(now) {
		c.st.expired++
		if c.onResolve != nil {
			c.onResolve(m, outExpired, now)
		}
		c.resolved = append(c.resolved, m.Offset)
		return
	}
	e, isHead := c.w.add(m)
	if isHead {
		c.route(e.ks, now)
	}
}

// flushResolved hands the offsets resolved since the last call to the log,
// which makes them durable with its next commit. The loop calls it after
// every batch of work.
func (c *core) flushResolved() {
	if len(c.resolved) == 0 {
		return
	}
	c.log.Resolve(c.resolved)
	c.resolved = c.resolved[:0]
}

// needsTick reports whether the heartbeat has work: deliveries awaiting an
// ack deadline, retries waiting for their backoff, dead letters to record
// again, members that are disconnected (eviction) or paused after a refusal.
// A group without any is left without a ticker, so idle groups cost nothing.
func (c *core) needsTick() bool {
	if c.w.deadlines.head != nil || len(c.w.retries) > 0 || len(c.dlqPending) > 0 {
		return true
	}
	for _, m := range c.byRing {
		if !m.active || m.paused {
			return true
		}
	}
	return false
}
