package keyshared

import "sync/atomic"

// Stats describe one group at a moment. Counters (Delivered onward) only grow
// for the life of a Dispatcher.
type Stats struct {
	Group string
	// Head is the last offset appended to the log, as the dispatcher last saw it.
	Head uint64
	// Cursor is the safe cursor: it and every offset below it are resolved.
	Cursor uint64
	// Backlog is Head - Cursor: messages not yet resolved (gaps included).
	Backlog uint64
	// Lag is how far reading trails the head: messages not yet read into the window.
	Lag uint64

	// InFlight counts messages delivered and awaiting an ack.
	InFlight int
	// Blocked counts messages in the window not in flight: behind their key's
	// in-flight message, waiting for a retry, or for a member with room.
	Blocked int
	// WindowBytes is what the window keeps: the size of its messages
	// (Message.Size) and of the keys it holds, idle ones included.
	WindowBytes int64
	// UnroutableKeys counts keys whose next message no member may take (key
	// filters, read access): they wait for a member that may.
	UnroutableKeys int
	// BlockedKeys counts keys with messages in the window but none in flight.
	BlockedKeys int
	// PoisonedKeys counts keys stopped by the block poison policy.
	PoisonedKeys int
	// Members counts live members; MembersAtLimit those at their in-flight limit.
	Members        int
	MembersAtLimit int

	Delivered    uint64 // deliveries a member took, first ones and retries
	Redeliveries uint64 // deliveries after the first of the same message
	Acked        uint64
	Nacks        uint64 // nacks that asked for a retry
	Rejects      uint64 // nacks with a never-retry reason code
	Timeouts     uint64 // deliveries whose ack timed out
	MemberLosses uint64 // in-flight messages requeued because their member left
	DeadLettered uint64
	Dropped      uint64 // dropped by the drop poison policy
	Expired      uint64 // skipped because their message expiry passed
	Evictions    uint64 // members evicted after staying inactive
	Refused      uint64 // deliveries a member refused (not counted as attempts)
	StaleAcks    uint64 // acks and nacks for messages not awaited from that member
	StoreErrors  uint64 // failed log reads, cursor saves and dead-letter writes

	// PerMember lists every live member, sorted by id.
	PerMember []MemberStats
}

// MemberStats describe one member of a group.
type MemberStats struct {
	ID       string
	InFlight int
	// Limit is the member's in-flight limit (its Receive Maximum or the
	// configured maximum, whichever is lower).
	Limit  int
	Active bool
}

const (
	sHead = iota
	sCursor
	sWindowBytes
	sLastRead
	sInFlight
	sWindow
	sBlockedKeys
	sPoisoned
	sMembers
	sAtLimit
	sDelivered
	sRedeliveries
	sAcked
	sNacks
	sRejects
	sTimeouts
	sLosses
	sDeadLettered
	sDropped
	sExpired
	sUnroutable
	sEvictions
	sRefused
	sStaleAcks
	sStoreErrors
	nStats
)

func (c *core) fill(v *[nStats]uint64) {
	v[sHead] = c.head
	v[sCursor] = c.cursor()
	v[sWindowBytes] = uint64(c.w.bytes)
	v[sLastRead] = c.lastRead
	v[sInFlight] = uint64(c.w.inflight)
	v[sWindow] = uint64(c.w.count)
	v[sBlockedKeys] = uint64(c.w.stalledKeys)
	v[sPoisoned] = uint64(c.w.poisoned)
	v[sMembers] = uint64(len(c.members))
	v[sAtLimit] = uint64(c.atLimit)
	v[sDelivered] = c.st.delivered
	v[sRedeliveries] = c.st.redeliveries
	v[sAcked] = c.st.acked
	v[sNacks] = c.st.nacks
	v[sRejects] = c.st.rejects
	v[sTimeouts] = c.st.timeouts
	v[sLosses] = c.st.losses
	v[sDeadLettered] = c.st.deadLettered
	v[sDropped] = c.st.dropped
	v[sExpired] = c.st.expired
	v[sUnroutable] = uint64(c.noEligible.n)
	v[sEvictions] = c.st.evictions
	v[sRefused] = c.st.refused
	v[sStaleAcks] = c.st.staleAcks
	v[sStoreErrors] = c.st.storeErrors
}

func statsFrom(group string, v *[nStats]uint64) Stats {
	s := Stats{
		Group:          group,
		Head:           v[sHead],
		Cursor:         v[sCursor],
		WindowBytes:    int64(v[sWindowBytes]),
		UnroutableKeys: int(v[sUnroutable]),
		InFlight:       int(v[sInFlight]),
		BlockedKeys:    int(v[sBlockedKeys]),
		PoisonedKeys:   int(v[sPoisoned]),
		Members:        int(v[sMembers]),
		MembersAtLimit: int(v[sAtLimit]),
		Delivered:      v[sDelivered],
		Redeliveries:   v[sRedeliveries],
		Acked:          v[sAcked],
		Nacks:          v[sNacks],
		Rejects:        v[sRejects],
		Timeouts:       v[sTimeouts],
		MemberLosses:   v[sLosses],
		DeadLettered:   v[sDeadLettered],
		Dropped:        v[sDropped],
		Expired:        v[sExpired],
		Evictions:      v[sEvictions],
		Refused:        v[sRefused],
		StaleAcks:      v[sStaleAcks],
		StoreErrors:    v[sStoreErrors],
	}
	// Readers load the values one by one, so guard differences against a
	// publish in between.
	if v[sWindow] > v[sInFlight] {
		s.Blocked = int(v[sWindow] - v[sInFlight])
	}
	if s.Head > s.Cursor {
		s.Backlog = s.Head - s.Cursor
	}
	if s.Head > v[sLastRead] {
		s.Lag = s.Head - v[sLastRead]
	}
	return s
}

// board is where the loop publishes Stats for readers on other goroutines:
// they load atomics and never wait for the loop.
type board struct {
	vals    [nStats]atomic.Uint64
	last    [nStats]uint64 // loop-owned copy of what vals hold
	members atomic.Pointer[[]*memberStat]
}

// publish copies c's state to b; only the owner of c may call it.
func (b *board) publish(c *core) {
	var v [nStats]uint64
	c.fill(&v)
	for i := range v {
		if v[i] != b.last[i] {
			b.vals[i].Store(v[i])
			b.last[i] = v[i]
		}
	}
	for _, m := range c.dirty {
		m.stat.inflight.Store(int64(m.inflight))
		m.stat.limit.Store(int64(m.limit))
		m.stat.active.Store(m.active)
		m.dirty = false
	}
	clear(c.dirty)
	c.dirty = c.dirty[:0]
	if c.membersChanged {
		ms := make([]*memberStat, len(c.byRing))
		for i, m := range c.byRing {
			ms[i] = m.stat
		}
		b.members.Store(&ms)
		c.membersChanged = false
	}
}

// load reads the last published Stats.
func (b *board) load(group string) Stats {
	var v [nStats]uint64
	for i := range v {
		v[i] = b.vals[i].Load()
	}
	s := statsFrom(group, &v)
	if ms := b.members.Load(); ms != nil {
		s.PerMember = make([]MemberStats, len(*ms))
		for i, m := range *ms {
			s.PerMember[i] = MemberStats{ID: m.id, InFlight: int(m.inflight.Load()), Limit: int(m.limit.Load()), Active: m.active.Load()}
		}
	}
	return s
}
