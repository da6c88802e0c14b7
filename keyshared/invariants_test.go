package keyshared

import (
	"errors"
	"fmt"
	"slices"
)

// checkInvariants verifies the four invariants of the package doc and the
// bookkeeping that keeps them cheap: every index agrees with the window, no
// key is forgotten (a key whose head is not in flight, retrying or poisoned
// sits on exactly one wait list), and the counters match. It scans the whole
// state, so only tests call it, after every step.
func (c *core) checkInvariants() error {
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 10 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	w := &c.w

	// Keys: log order, one in flight per key (invariant 1), live holders
	// (invariant 4), nothing forgotten.
	entries, inflight, stalled, retrying, poisoned, dlq := 0, 0, 0, 0, 0, 0
	idle := 0
	for key, ks := range w.keys {
		if ks.head == nil && ks.list == &w.idle && ks.key == key && !ks.stalled && ks.n == 0 {
			idle++
			continue
		}
		if ks.key != key || ks.head == nil {
			bad("key %q: bad queue (key %q, head %v)", key, ks.key, ks.head)
			continue
		}
		n := 0
		var prev *entry
		for e := ks.head; e != nil; e = e.knext {
			n++
			entries++
			if e.ks != ks || w.queueKey(&e.msg) != key {
				bad("offset %d: in queue of key %q with key %q", e.msg.Offset, key, e.msg.Key)
			}
			if prev != nil && e.msg.Offset <= prev.msg.Offset {
				bad("key %q: offset %d after %d", key, e.msg.Offset, prev.msg.Offset)
			}
			if w.byOffset.get(e.msg.Offset) != e {
				bad("offset %d: missing from the offset index", e.msg.Offset)
			}
			if e != ks.head && e.state != entryWaiting {
				bad("invariant 1: key %q: offset %d is %d behind its head %d", key, e.msg.Offset, e.state, ks.head.msg.Offset)
			}
			if e.knext == nil && ks.tail != e {
				bad("key %q: tail is not the last entry", key)
			}
			prev = e
		}
		if n != ks.n {
			bad("key %q: n = %d, queue holds %d", key, ks.n, n)
		}
		h := ks.head
		if (h.state != entryInflight) != ks.stalled {
			bad("key %q: stalled flag %v with head state %d", key, ks.stalled, h.state)
		}
		if h.state != entryInflight {
			stalled++
		}
		switch h.state {
		case entryInflight:
			inflight++
			if h.holder == nil || h.holder.removed || c.members[h.holder.id] != h.holder {
				bad("invariant 4: key %q: offset %d in flight on a member that left", key, h.msg.Offset)
			}
			if ks.list != nil {
				bad("key %q: in flight and on a wait list", key)
			}
		case entryRetry:
			retrying++
			if h.heapIdx < 0 || h.heapIdx >= len(w.retries) || w.retries[h.heapIdx] != h {
				bad("key %q: offset %d retrying but not in the retry heap", key, h.msg.Offset)
			}
		case entryPoisoned:
			poisoned++
		case entryDLQPending:
			dlq++
			if !slices.Contains(c.dlqPending, h) {
				bad("key %q: offset %d awaits its dead letter but is not pending", key, h.msg.Offset)
			}
		case entryWaiting:
			switch ks.list {
			case nil:
				bad("liveness: key %q: head %d waits on no list", key, h.msg.Offset)
			case &c.noMember:
				if len(c.members) != 0 {
					bad("liveness: key %q waits for members, but there are %d", key, len(c.members))
				}
			case &c.noEligible:
				if m := c.pick(&h.msg); m != nil || len(c.members) == 0 {
					bad("liveness: key %q waits for an eligible member, but %v may take it (%d members)", key, m, len(c.members))
				}
			default:
				m := c.pick(&h.msg)
				if m == nil || &m.waitq != ks.list {
					bad("invariant 4: key %q waits on a member the ring does not map it to", key)
				} else if m.canTake() {
					bad("liveness: key %q waits on member %q which can take messages", key, m.id)
				}
			}
		}
		if h.state != entryWaiting && ks.list != nil {
			bad("key %q: head state %d but on a wait list", key, h.state)
		}
	}
	if idle != w.idle.n || idle > w.idleMax {
		bad("idle keys: %d in the map, %d listed, at most %d", idle, w.idle.n, w.idleMax)
	}
	if entries != w.count || w.byOffset.n != w.count {
		bad("window count %d, keys hold %d, offset index %d", w.count, entries, w.byOffset.n)
	}
	if w.count > c.cfg.Window {
		bad("window holds %d > %d", w.count, c.cfg.Window)
	}
	if inflight != w.inflight || stalled != w.stalledKeys || retrying != len(w.retries) || poisoned != w.poisoned || dlq != len(c.dlqPending) {
		bad("counts: inflight %d/%d stalled %d/%d retrying %d/%d poisoned %d/%d dlq %d/%d",
			inflight, w.inflight, stalled, w.stalledKeys, retrying, len(w.retries), poisoned, w.poisoned, dlq, len(c.dlqPending))
	}

	// Offset order and the cursor (invariant 3).
	n := 0
	var last uint64
	for e := w.order.head; e != nil; e = e.onext {
		n++
		if e.msg.Offset <= last {
			bad("offset list: %d after %d", e.msg.Offset, last)
		}
		last = e.msg.Offset
		if e.msg.Offset > c.lastRead {
			bad("offset %d beyond last read %d", e.msg.Offset, c.lastRead)
		}
	}
	if n != w.count {
		bad("offset list holds %d, window %d", n, w.count)
	}
	var size, idleBytes int64
	for e := w.order.head; e != nil; e = e.onext {
		size += int64(e.msg.Size())
	}
	for key, ks := range w.keys {
		size += keyCost(key)
		if ks.head == nil {
			idleBytes += keyCost(key)
		}
	}
	if size != w.bytes {
		bad("window bytes %d, entries and keys hold %d", w.bytes, size)
	}
	if idleBytes != w.idleBytes || idleBytes > w.idleBytesMax {
		bad("idle keys cost %d, counted %d, at most %d", idleBytes, w.idleBytes, w.idleBytesMax)
	}
	cur := c.cursor()
	for _, off := range c.resolved {
		if w.byOffset.get(off) != nil {
			bad("invariant 3: offset %d handed to the log as resolved while in the window", off)
		}
	}
	if c.nextRead != c.lastRead+1 || cur > c.lastRead {
		bad("read position: next %d, last %d, cursor %d", c.nextRead, c.lastRead, cur)
	}

	// In-flight indexes.
	n = 0
	for e := w.deadlines.head; e != nil; e = e.dnext {
		n++
		if e.state != entryInflight {
			bad("deadline list: offset %d is not in flight", e.msg.Offset)
		}
		if e.dnext != nil && e.dnext.deadline.Before(e.deadline) {
			bad("deadline list out of order at offset %d", e.msg.Offset)
		}
	}
	if n != w.inflight {
		bad("deadline list holds %d, in flight %d", n, w.inflight)
	}

	// Members and the ring (invariant 4).
	if len(c.byRing) != len(c.members) || len(c.ring.members) != len(c.members) || len(c.ring.vnodes) != len(c.members)*VirtualNodes {
		bad("ring: %d members, %d on the ring, %d points", len(c.members), len(c.byRing), len(c.ring.vnodes))
	}
	atLimit, sum := 0, 0
	for i, m := range c.byRing {
		if c.members[m.id] != m || c.ring.members[i].id != m.id || !c.ring.members[i].filters.equal(m.filters) {
			bad("ring member %d (%q) does not match the members", i, m.id)
		}
		if i > 0 && c.byRing[i-1].id >= m.id {
			bad("ring members not sorted at %q", m.id)
		}
		k := 0
		for e := m.infl.head; e != nil; e = e.mnext {
			k++
			if e.holder != m || e.state != entryInflight {
				bad("member %q: lists offset %d held by another", m.id, e.msg.Offset)
			}
		}
		if k != m.inflight {
			bad("member %q: inflight %d, list %d", m.id, m.inflight, k)
		}
		sum += k
		if m.inflight >= m.limit {
			atLimit++
		}
		if (m.inflight >= m.limit) != m.full {
			bad("member %q: full flag %v at %d/%d", m.id, m.full, m.inflight, m.limit)
		}
		for ks := m.waitq.head; ks != nil; ks = ks.wnext {
			if ks.list != &m.waitq {
				bad("member %q: wait list holds key %q listed elsewhere", m.id, ks.key)
			}
		}
	}
	if sum != w.inflight {
		bad("members hold %d in flight, window %d", sum, w.inflight)
	}
	if atLimit != c.atLimit {
		bad("members at limit %d, counted %d", atLimit, c.atLimit)
	}
	return errors.Join(errs...)
}
