package keyshared

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var (
	flagSeed  = flag.Uint64("keyshared.seed", 0, "run the model test with only this seed (replays a failure)")
	flagSeeds = flag.Int("keyshared.seeds", 200, "number of seeds the model test runs")
	flagSteps = flag.Int("keyshared.steps", 5000, "random steps per seed in the model test")
)

// TestModel drives the dispatch state with random publishes, acks, nacks,
// rejects, stale acks, clock advances (timeouts, retries, eviction), joins,
// leaves, disconnects, reconnects, filter and read-access changes, refusals,
// store failures, log commits, and restarts (graceful, or crashes that lose
// the resolutions the log had not committed). After every step it checks
// checkInvariants; every delivery is checked as it happens against an
// independent model (one in flight per key, per-key log order, never a
// message the log holds as resolved, the ring's member, filters, read access,
// activity); every resolution against what the model did; every offset the
// log is told is resolved against the resolutions. At the end the members
// ack everything and the whole log must be resolved and its cursor at its head.
func TestModel(t *testing.T) {
	seeds := []uint64{*flagSeed}
	if *flagSeed == 0 {
		base := uint64(time.Now().UnixNano())
		seeds = seeds[:0]
		for i := range *flagSeeds {
			seeds = append(seeds, base+uint64(i))
		}
		t.Logf("seeds %d..%d (%d steps each); replay one with -keyshared.seed=N", seeds[0], seeds[len(seeds)-1], *flagSteps)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			m := newModel(t, seed)
			defer func() {
				if t.Failed() {
					t.Logf("replay: go test ./keyshared -run 'TestModel/%d$' -keyshared.seed=%d -keyshared.steps=%d", seed, seed, *flagSteps)
				}
			}()
			m.run(*flagSteps)
		})
	}
}

type modelMember struct {
	id      string
	recvMax int
	filters []string
	fs      filterSet
	// deny, when set, is a topic the member may not read.
	deny   string
	active bool
}

func (mm *modelMember) canRead(topic string) bool { return topic != mm.deny }

type model struct {
	t   *testing.T
	rng *rand.Rand
	cfg Config
	log *memLog
	out *recDeliverer
	c   *core
	now time.Time

	keys    []string
	members map[string]*modelMember // in the core
	// holding: offset -> member that holds it (delivered, not yet answered or
	// revoked). heldKey: key -> offset held.
	holding map[uint64]string
	held    []uint64
	heldKey map[string]uint64
	// last: offset -> member of its last delivery in this incarnation.
	last map[uint64]string

	// incStart is the log's cursor the current incarnation started from.
	incStart uint64
	// resolvedNow: offsets resolved in this incarnation (or already resolved
	// in the log when it started); resolved: ever.
	resolvedNow map[uint64]bool
	resolved    map[uint64]outcome
	mayAck      map[uint64]bool
	// perKey: offsets of each key in log order; next[key] indexes the first one
	// above incStart not yet resolved in this incarnation.
	perKey map[string][]uint64
	next   map[string]int
	expiry map[uint64]time.Time

	failing    int // steps left with a failing store
	deliveries int
	steps      int
	restarts   int
	op         string
}

func newModel(t *testing.T, seed uint64) *model {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	cfg := DefaultConfig()
	cfg.Group = "model"
	cfg.MaxDeliveries = 1 + rng.IntN(4)
	cfg.Poison = PoisonPolicy(1 + rng.IntN(3))
	cfg.AckTimeout = time.Duration(1+rng.IntN(6)) * 500 * time.Millisecond
	cfg.RetryBackoffBase = time.Duration(rng.IntN(3)) * 500 * time.Millisecond
	cfg.RetryBackoffMax = cfg.RetryBackoffBase * time.Duration(1+rng.IntN(4))
	cfg.MemberMaxInflight = 1 + rng.IntN(6)
	cfg.Window = 1 + rng.IntN(40)
	cfg.ReadBatch = 1 + rng.IntN(8)
	cfg.EvictAfter = 1 + rng.IntN(6)
	if rng.IntN(3) == 0 {
		cfg.WindowBytes = int64(1 + rng.IntN(12*170)) // a few messages of ~170 bytes
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	m := &model{
		t: t, rng: rng, cfg: cfg, log: newMemLog(), out: newRecDeliverer(),
		now:      time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		members:  make(map[string]*modelMember),
		resolved: make(map[uint64]outcome),
		perKey:   make(map[string][]uint64),
		expiry:   make(map[uint64]time.Time),
	}
	for i := range 1 + rng.IntN(24) {
		m.keys = append(m.keys, fmt.Sprintf("k%d", i))
	}
	m.out.onDeliver = m.onDeliver
	m.out.onRevoke = m.onRevoke
	m.log.onResolve = m.onLogResolve
	m.startIncarnation()
	t.Logf("config: max deliveries %d, poison %v, ack timeout %v, backoff %v..%v, member limit %d, window %d / %d bytes, batch %d, evict after %d, %d keys",
		cfg.MaxDeliveries, cfg.Poison, cfg.AckTimeout, cfg.RetryBackoffBase, cfg.RetryBackoffMax, cfg.MemberMaxInflight,
		cfg.Window, cfg.WindowBytes, cfg.ReadBatch, cfg.EvictAfter, len(m.keys))
	return m
}

func (m *model) fatalf(format string, args ...any) {
	m.t.Fatalf("step %d (%s): %s", m.steps, m.op, fmt.Sprintf(format, args...))
}

// startIncarnation starts a core over the log, as after a (re)start.
func (m *model) startIncarnation() {
	m.c = newCore(m.cfg, m.log, m.out)
	m.c.onResolve = m.onResolve
	if err := m.c.open(); err != nil {
		m.fatalf("open: %v", err)
	}
	m.incStart = m.log.persisted()
	m.holding = make(map[uint64]string)
	m.held = m.held[:0]
	m.heldKey = make(map[string]uint64)
	m.last = make(map[uint64]string)
	m.resolvedNow = make(map[uint64]bool)
	for o := m.incStart + 1; o <= m.log.Head(); o++ {
		if m.log.isResolved(o) {
			m.resolvedNow[o] = true // durably resolved: must never come back
		}
	}
	m.mayAck = make(map[uint64]bool)
	m.next = make(map[string]int)
	for k, offs := range m.perKey {
		m.next[k] = len(offs)
		for i, o := range offs {
			if o > m.incStart {
				m.next[k] = i
				break
			}
		}
	}
	// Members come back as their sessions reconnect.
	old := m.members
	m.members = make(map[string]*modelMember)
	for _, id := range sortedKeys(old) {
		mm := old[id]
		mm.active = true
		m.join(mm)
	}
	m.c.poll(m.now)
}

func sortedKeys[V any](mp map[string]V) []string {
	ks := make([]string, 0, len(mp))
	for k := range mp {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// onDeliver checks a delivery against the model as it happens.
func (m *model) onDeliver(d delivery) {
	m.deliveries++
	mm := m.members[d.member]
	switch {
	case mm == nil:
		m.fatalf("offset %d delivered to %q, not a member", d.offset, d.member)
	case !mm.active:
		m.fatalf("offset %d delivered to inactive member %q", d.offset, d.member)
	case !mm.fs.match(d.key):
		m.fatalf("offset %d (key %q) delivered to %q whose filters %v do not match", d.offset, d.key, d.member, mm.filters)
	case !mm.canRead(d.key): // topic = key in memLog
		m.fatalf("offset %d (topic %q) delivered to %q, which may not read it", d.offset, d.key, d.member)
	}
	if o, ok := m.heldKey[d.key]; ok {
		m.fatalf("invariant 1: offset %d of key %q delivered to %q while offset %d is held by %q", d.offset, d.key, d.member, o, m.holding[o])
	}
	if m.resolvedNow[d.offset] {
		m.fatalf("offset %d delivered after it was resolved", d.offset)
	}
	if want := m.c.pick(&m.log.msgs[d.offset-1]); want == nil || want.id != d.member {
		m.fatalf("invariant 4: key %q delivered to %q, the ring says %v", d.key, d.member, want)
	}
	// Invariant 2: it must be the key's first message above the incarnation's
	// start that this incarnation has not resolved.
	offs := m.perKey[d.key]
	i := m.next[d.key]
	for i < len(offs) && m.resolvedNow[offs[i]] {
		i++
	}
	m.next[d.key] = i
	if i >= len(offs) || offs[i] != d.offset {
		want := uint64(0)
		if i < len(offs) {
			want = offs[i]
		}
		m.fatalf("invariant 2: key %q: delivered offset %d, next in log order is %d", d.key, d.offset, want)
	}
	m.holding[d.offset] = d.member
	m.held = append(m.held, d.offset)
	m.heldKey[d.key] = d.offset
	m.last[d.offset] = d.member
}

func (m *model) onRevoke(d delivery) {
	if m.holding[d.offset] != d.member {
		m.fatalf("revoke of offset %d from %q, which does not hold it (%q does)", d.offset, d.member, m.holding[d.offset])
	}
	m.release(d.offset)
}

// release forgets a holding (the member answered, or it was revoked).
func (m *model) release(o uint64) {
	delete(m.holding, o)
	i := slices.Index(m.held, o)
	m.held[i] = m.held[len(m.held)-1]
	m.held = m.held[:len(m.held)-1]
	key := m.log.msgs[o-1].Key
	if m.heldKey[key] == o {
		delete(m.heldKey, key)
	}
}

// onResolve checks that a resolution is one the model allows.
func (m *model) onResolve(msg *Message, out outcome, now time.Time) {
	o := msg.Offset
	if m.resolvedNow[o] {
		m.fatalf("offset %d resolved twice", o)
	}
	if _, ok := m.holding[o]; ok {
		m.fatalf("offset %d resolved (%v) while %q holds it", o, out, m.holding[o])
	}
	switch out {
	case outAcked:
		if !m.mayAck[o] {
			m.fatalf("offset %d acked without an acceptable ack", o)
		}
	case outDeadLettered:
		m.log.mu.Lock()
		ok := m.log.deadAt[o]
		m.log.mu.Unlock()
		if !ok {
			m.fatalf("offset %d dead-lettered but not recorded by the log", o)
		}
	case outDropped:
		if m.cfg.Poison != PoisonDrop {
			m.fatalf("offset %d dropped under policy %v", o, m.cfg.Poison)
		}
	case outExpired:
		if exp := m.expiry[o]; exp.IsZero() || now.Before(exp) {
			m.fatalf("offset %d expired at %v, expiry %v", o, now, exp)
		}
	}
	m.resolvedNow[o] = true
	m.resolved[o] = out
}

// onLogResolve checks invariant 3 for an offset the log is told is resolved.
func (m *model) onLogResolve(o uint64) {
	if !m.resolvedNow[o] {
		m.fatalf("invariant 3: offset %d handed to the log as resolved, but it is not", o)
	}
}

// check checks the invariants, then hands the resolutions to the log as the
// loop does after every batch.
func (m *model) check() {
	if err := m.c.checkInvariants(); err != nil {
		m.fatalf("%v", err)
	}
	m.c.flushResolved()
	if len(m.c.members) != len(m.members) {
		m.fatalf("core has %d members, model %d", len(m.c.members), len(m.members))
	}
	for id, mm := range m.members {
		cm := m.c.members[id]
		if cm == nil || cm.active != mm.active || !cm.filters.equal(mm.fs) {
			m.fatalf("member %q differs from the model", id)
		}
	}
}

func (m *model) join(mm *modelMember) {
	fs, err := compileFilters(mm.filters)
	if err != nil {
		m.fatalf("filters %v: %v", mm.filters, err)
	}
	mm.fs = fs
	m.members[mm.id] = mm
	spec := memberSpec{recvMax: mm.recvMax, filters: fs}
	if mm.deny != "" {
		spec.canRead = mm.canRead
	}
	if err := m.c.addMember(mm.id, spec, m.now); err != nil {
		m.fatalf("add %q: %v", mm.id, err)
	}
	m.c.poll(m.now) // as the loop does after every command
}

func (m *model) randomFilters() []string {
	if m.rng.IntN(5) < 4 {
		return nil
	}
	pats := []string{"k1*", "k?", "*", "k*", "k1?", "x*", "k*3", "k2", "?5"}
	fs := []string{pats[m.rng.IntN(len(pats))]}
	if m.rng.IntN(3) == 0 {
		fs = append(fs, pats[m.rng.IntN(len(pats))])
	}
	return fs
}

// randomHeld returns a holding of an active member, or ok false.
func (m *model) randomHeld() (uint64, string, bool) {
	for range 4 {
		if len(m.held) == 0 {
			return 0, "", false
		}
		o := m.held[m.rng.IntN(len(m.held))]
		if mm := m.members[m.holding[o]]; mm != nil && mm.active {
			return o, m.holding[o], true
		}
	}
	return 0, "", false
}

// answer sends an ack, nack or reject for a holding and checks it was taken.
func (m *model) answer(kind resultKind, reason byte) {
	o, id, ok := m.randomHeld()
	if !ok {
		return
	}
	stale := m.c.st.staleAcks
	m.release(o)
	switch kind {
	case resAck:
		m.mayAck[o] = true
		m.c.ack(id, o, m.now)
	case resNack:
		m.c.nack(id, o, reason, m.now)
	case resReject:
		m.c.reject(id, o, reason, m.now)
	}
	if m.c.st.staleAcks != stale {
		m.fatalf("answer %d from %q for held offset %d was taken as stale", kind, id, o)
	}
}

// advance moves the clock and runs the heartbeats due.
func (m *model) advance(d time.Duration) {
	for d > 0 {
		step := min(d, m.cfg.Heartbeat)
		m.now = m.now.Add(step)
		d -= step
		if step == m.cfg.Heartbeat {
			m.c.tick(m.now)
			m.syncEvictions()
			m.check()
		}
	}
}

// syncEvictions forgets members the core evicted.
func (m *model) syncEvictions() {
	for id := range m.members {
		if m.c.members[id] == nil {
			if m.members[id].active {
				m.fatalf("active member %q evicted", id)
			}
			delete(m.members, id)
		}
	}
}

func (m *model) step() {
	r := m.rng.IntN(1000)
	switch {
	case r < 300:
		m.op = "publish"
		key := m.keys[m.rng.IntN(len(m.keys))]
		var exp time.Time
		if m.rng.IntN(10) == 0 {
			exp = m.now.Add(time.Duration(m.rng.IntN(4000)) * time.Millisecond)
		}
		o := m.log.append(key, exp)
		m.perKey[key] = append(m.perKey[key], o)
		m.expiry[o] = exp
		if m.rng.IntN(10) < 7 {
			m.c.poll(m.now)
		}
	case r < 580:
		m.op = "ack"
		m.answer(resAck, 0)
	case r < 630:
		m.op = "nack"
		m.answer(resNack, byte(0x80+m.rng.IntN(0x20)))
	case r < 645:
		m.op = "reject"
		m.answer(resReject, ReasonNotAuthorized)
	case r < 680:
		m.op = "stale ack"
		if len(m.log.msgs) == 0 || len(m.members) == 0 {
			return
		}
		o := uint64(1 + m.rng.IntN(len(m.log.msgs)))
		ids := sortedKeys(m.members)
		id := ids[m.rng.IntN(len(ids))]
		holder, held := m.holding[o]
		if held && holder == id {
			return
		}
		// Acceptable only from the member that had it last, while nobody holds it.
		ok := !held && m.last[o] == id
		if ok {
			m.mayAck[o] = true
		}
		was := m.resolvedNow[o]
		m.c.ack(id, o, m.now)
		if !ok && !was && m.resolvedNow[o] {
			m.fatalf("stale ack of %d from %q resolved it", o, id)
		}
	case r < 800:
		m.op = "advance"
		m.advance(time.Duration(1+m.rng.IntN(8)) * 250 * time.Millisecond)
	case r < 830:
		m.op = "join"
		id := fmt.Sprintf("m%d", m.rng.IntN(8))
		if m.members[id] != nil {
			return
		}
		rm := 0
		if m.rng.IntN(2) == 0 {
			rm = 1 + m.rng.IntN(4)
		}
		m.join(&modelMember{id: id, recvMax: rm, filters: m.randomFilters(), deny: m.randomDeny(), active: true})
	case r < 850:
		m.op = "leave"
		if id, ok := m.randomMember(); ok {
			delete(m.members, id)
			if err := m.c.removeMember(id, false, m.now); err != nil {
				m.fatalf("remove %q: %v", id, err)
			}
		}
	case r < 880:
		m.op = "disconnect"
		if id, ok := m.randomMember(); ok {
			m.members[id].active = false
			if err := m.c.setActive(id, false, m.now); err != nil {
				m.fatalf("disconnect %q: %v", id, err)
			}
		}
	case r < 910:
		m.op = "reconnect"
		if id, ok := m.randomMember(); ok {
			m.members[id].active = true
			if err := m.c.setActive(id, true, m.now); err != nil {
				m.fatalf("reconnect %q: %v", id, err)
			}
		}
	case r < 930:
		m.op = "filter change"
		if id, ok := m.randomMember(); ok {
			mm := m.members[id]
			mm.filters = m.randomFilters()
			mm.deny = m.randomDeny()
			mm.recvMax = m.rng.IntN(4)
			mm.active = true
			m.join(mm)
		}
	case r < 960:
		m.op = "refuse"
		if id, ok := m.randomMember(); ok {
			m.out.refuse[id] = !m.out.refuse[id]
		}
	case r < 970:
		m.op = "store failure"
		m.failing = 1 + m.rng.IntN(20)
		m.setFailing(true)
	case r < 975:
		m.op = "restart"
		if m.rng.IntN(2) == 0 {
			m.log.crash() // a crash keeps only what the log committed
		} else {
			m.c.flushResolved()
			m.log.commit()
		}
		m.restarts++
		m.startIncarnation()
	case r < 985:
		m.op = "log commit"
		m.log.commit()
	default:
		m.op = "poll"
		m.c.poll(m.now)
	}
}

func (m *model) setFailing(on bool) {
	m.log.mu.Lock()
	m.log.failDead, m.log.failRead = on, on && m.rng.IntN(2) == 0
	m.log.mu.Unlock()
}

// randomDeny returns a topic a member may not read, mostly none.
func (m *model) randomDeny() string {
	if m.rng.IntN(6) != 0 {
		return ""
	}
	return m.keys[m.rng.IntN(len(m.keys))]
}

func (m *model) randomMember() (string, bool) {
	if len(m.members) == 0 {
		return "", false
	}
	ids := sortedKeys(m.members)
	return ids[m.rng.IntN(len(ids))], true
}

func (m *model) run(steps int) {
	for m.steps = 0; m.steps < steps; m.steps++ {
		m.step()
		if m.failing > 0 {
			if m.failing--; m.failing == 0 {
				m.setFailing(false)
			}
		}
		m.check()
	}
	m.drain()
}

// drain lets every member work: reconnected, accepting, acking everything
// (late acks included, so that even poison-blocked keys resolve). The whole
// log must end resolved and the persisted cursor at the head.
func (m *model) drain() {
	m.op = "drain"
	m.failing = 0
	m.setFailing(false)
	clear(m.out.refuse)
	for _, id := range sortedKeys(m.members) {
		m.members[id].active = true
		if err := m.c.setActive(id, true, m.now); err != nil {
			m.fatalf("reconnect %q: %v", id, err)
		}
	}
	if m.members["drain"] == nil { // takes every key, so nothing stays unroutable
		m.join(&modelMember{id: "drain", active: true})
	}
	head := m.log.Head()
	for round := 0; ; round++ {
		if round > 20000 {
			m.fatalf("stuck: window %d, cursor %d of %d, stats %+v", m.c.w.count, m.c.cursor(), head, m.c.stats())
		}
		m.steps++
		for len(m.held) > 0 {
			o := m.held[len(m.held)-1]
			id := m.holding[o]
			m.release(o)
			m.mayAck[o] = true
			m.c.ack(id, o, m.now)
		}
		// Late acks resolve poison-blocked heads.
		for e := m.c.w.order.head; e != nil; e = e.onext {
			if e.state == entryPoisoned && m.last[e.msg.Offset] != "" {
				m.mayAck[e.msg.Offset] = true
				m.c.ack(m.last[e.msg.Offset], e.msg.Offset, m.now)
				break
			}
		}
		m.check()
		if m.c.w.count == 0 && m.c.lastRead == head {
			break
		}
		m.advance(m.cfg.Heartbeat)
	}
	m.c.flushResolved()
	m.log.commit()
	if m.log.persisted() != head {
		m.fatalf("persisted cursor %d, head %d", m.log.persisted(), head)
	}
	counts := map[outcome]int{}
	for o := uint64(1); o <= head; o++ {
		out, ok := m.resolved[o]
		if !ok {
			m.fatalf("offset %d never resolved", o)
		}
		counts[out]++
	}
	s := m.c.stats()
	m.t.Logf("%d steps, %d messages, %d deliveries, %d restarts: %v; last incarnation %+v",
		m.steps, head, m.deliveries, m.restarts, counts, s)
	if head > 0 && m.deliveries == 0 {
		m.fatalf("nothing was ever delivered")
	}
}
