package keyshared

import (
	"cmp"
	"slices"
	"time"
)

// Membership changes on the dispatch loop: members joining, leaving,
// disconnecting and coming back, and the ring they route by.

// addMember adds a member, or updates one that exists (a re-subscribe: new
// Receive Maximum and filters, and it counts as connected).
func (c *core) addMember(id string, spec memberSpec, now time.Time) error {
	if id == "" {
		return ErrInvalidMember
	}
	recvMax, fs := spec.recvMax, spec.filters
	limit := c.cfg.MemberMaxInflight
	if recvMax > 0 && recvMax < limit {
		limit = recvMax
	}
	if m := c.members[id]; m != nil {
		m.recvMax, m.limit = recvMax, limit
		m.active, m.inactiveTicks, m.paused = true, 0, false
		c.memberChanged(m)
		// Functions cannot be compared: any read access given may differ
		// from the last (another user may hold the client id now).
		if !m.filters.equal(fs) || m.canRead != nil || spec.canRead != nil || m.fits != nil || spec.fits != nil {
			m.filters, m.canRead, m.fits = fs, spec.canRead, spec.fits
			c.rebuildRing()
			c.rerouteWaiting(nil, nil, now)
		} else {
			c.serviceMember(m, now)
		}
		return nil
	}
	m := &member{id: id, recvMax: recvMax, limit: limit, filters: fs, canRead: spec.canRead, fits: spec.fits, active: true, stat: &memberStat{id: id}}
	c.members[id] = m
	c.memberChanged(m)
	c.rebuildRing()
	c.rerouteWaiting(nil, nil, now)
	c.logger.Info("keyshared: member joined", "member", id, "limit", limit, "filters", len(fs))
	return nil
}

// removeMember takes a member off the ring and requeues its in-flight
// messages at the head of their keys (each counts as a failed attempt).
func (c *core) removeMember(id string, evicted bool, now time.Time) error {
	m := c.members[id]
	if m == nil {
		return ErrUnknownMember
	}
	delete(c.members, id)
	m.removed = true
	c.memberChanged(m) // leaves atLimit
	c.rebuildRing()
	requeued := c.scratch[:0]
	for e := m.infl.head; e != nil; e = m.infl.head {
		c.endInflight(e)
		c.out.Revoke(m.id, e.msg.Offset)
		c.st.losses++
		e.attempts++
		e.lastReason = 0
		if e.attempts >= c.cfg.MaxDeliveries {
			c.poison(e, now)
			continue
		}
		c.w.markKey(e.ks)
		requeued = append(requeued, e.ks)
	}
	n := len(requeued)
	c.rerouteWaiting(&m.waitq, requeued, now) // with the waiting ones, in log order
	if evicted {
		c.st.evictions++
		c.logger.Warn("keyshared: member evicted after inactivity", "member", id, "requeued", n)
	} else {
		c.logger.Info("keyshared: member left", "member", id, "requeued", n)
	}
	return nil
}

// setActive marks a member connected or disconnected.
func (c *core) setActive(id string, active bool, now time.Time) error {
	m := c.members[id]
	if m == nil {
		return ErrUnknownMember
	}
	m.inactiveTicks = 0
	if m.active == active {
		return nil
	}
	m.active = active
	c.memberChanged(m)
	if active {
		m.paused = false
		c.serviceMember(m, now)
	}
	return nil
}

func (c *core) rebuildRing() {
	rms := make([]ringMember, 0, len(c.members))
	for _, m := range c.members {
		rms = append(rms, ringMember{id: m.id, filters: m.filters, canRead: m.canRead, fits: m.fits})
	}
	c.ring = buildRing(rms)
	c.byRing = make([]*member, len(c.ring.members))
	for i, rm := range c.ring.members {
		c.byRing[i] = c.members[rm.id]
	}
	c.membersChanged = true
}

// rerouteWaiting routes again every key waiting for a member, after the ring
// changed; extra is the wait list of a member that just left, requeued the
// keys of what was in flight on it (in c.scratch, or nil). They go oldest
// head first, whichever list they waited on: in an unordered group every message is a key of its own,
// and one requeued from a lost member must not go out after a later one that
// waited for room or was refused as the member went (the member's wait list
// used to be routed first: a bridge's pipelined rule sent a key's later
// messages before its earlier ones after the remote was killed). The wait
// lists hold at most Config.Window keys, and membership changes are rare.
func (c *core) rerouteWaiting(extra *keyList, requeued []*keyState, now time.Time) {
	keys := requeued
	if keys == nil {
		keys = c.scratch[:0]
	}
	drain := func(l *keyList) {
		for ks := l.pop(); ks != nil; ks = l.pop() {
			keys = append(keys, ks)
		}
	}
	if extra != nil {
		drain(extra)
	}
	for _, m := range c.byRing {
		drain(&m.waitq)
	}
	drain(&c.noMember)
	drain(&c.noEligible)
	slices.SortFunc(keys, func(a, b *keyState) int { return cmp.Compare(a.head.msg.Offset, b.head.msg.Offset) })
	for _, ks := range keys {
		c.route(ks, now)
	}
	clear(keys)
	c.scratch = keys[:0]
}
