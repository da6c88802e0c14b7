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
			c.rerouteWaiting(nil, now)
		} else {
			c.serviceMember(m, now)
		}
		return nil
	}
	m := &member{id: id, recvMax: recvMax, limit: limit, filters: fs, canRead: spec.canRead, fits: spec.fits, active: true, stat: &memberStat{id: id}}
	c.members[id] = m
	c.memberChanged(m)
	c.rebuildRing()
	c.rerouteWaiting(nil, now)
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
	var requeued []*keyState
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
	// In log order: the member's list is newest first, and keys that wait
	// for a member are served in the order they start waiting (an unordered
	// group keeps its messages in order across the loss of its member).
	slices.SortFunc(requeued, func(a, b *keyState) int { return cmp.Compare(a.head.msg.Offset, b.head.msg.Offset) })
	for _, ks := range requeued {
		c.route(ks, now)
	}
	c.rerouteWaiting(&m.waitq, now)
	if evicted {
		c.st.evictions++
		c.logger.Warn("keyshared: member evicted after inactivity", "member", id, "requeued", len(requeued))
	} else {
		c.logger.Info("keyshared: member left", "member", id, "requeued", len(requeued))
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
// changed; extra is the wait list of a member that just left.
func (c *core) rerouteWaiting(extra *keyList, now time.Time) {
	keys := c.scratch[:0]
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
	for _, ks := range keys {
		c.route(ks, now)
	}
	clear(keys)
	c.scratch = keys[:0]
}
