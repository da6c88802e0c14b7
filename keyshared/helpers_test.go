package keyshared

import (
	"errors"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var errStore = errors.New("test store failure")

// memLog is an in-memory Log. It keeps its messages sorted by offset and can
// be told to fail. Resolutions are pending until commit (as a real log's are
// until its next commit): crash drops the pending ones.
type memLog struct {
	mu   sync.Mutex
	msgs []Message
	head uint64
	// floor: offsets <= floor were resolved before the test began (tests set it).
	floor uint64
	// cursor: every offset <= cursor is resolved (floor, committed, pending)
	// or a gap.
	cursor    uint64
	committed map[uint64]bool
	pending   map[uint64]bool
	resolves  int // Resolve calls
	dead      []DeadLetter
	deadAt    map[uint64]bool
	failDead  bool
	failRead  bool
	// onResolve, when set, sees every offset handed to Resolve.
	onResolve func(off uint64)
}

func newMemLog() *memLog {
	return &memLog{deadAt: make(map[uint64]bool), committed: make(map[uint64]bool), pending: make(map[uint64]bool)}
}

// append adds a message with the next offset and returns it.
func (l *memLog) append(key string, expiresAt time.Time) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.head++
	l.msgs = append(l.msgs, Message{Offset: l.head, Key: key, Topic: key, QoS: 1, ExpiresAt: expiresAt, Payload: []byte(key)})
	return l.head
}

// skip burns an offset without a message (a gap, as trimming leaves).
func (l *memLog) skip() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.head++
}

// setFloor declares offsets <= c resolved before the test began.
func (l *memLog) setFloor(c uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.floor = max(l.floor, c)
	l.advanceLocked()
}

func (l *memLog) isResolvedLocked(off uint64) bool {
	return off <= l.cursor || l.committed[off] || l.pending[off]
}

// hasLocked reports whether off holds a message (not a gap).
func (l *memLog) hasLocked(off uint64) bool {
	i := sort.Search(len(l.msgs), func(i int) bool { return l.msgs[i].Offset >= off })
	return i < len(l.msgs) && l.msgs[i].Offset == off
}

func (l *memLog) ReadFrom(from uint64, max int, buf []Message) ([]Message, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failRead {
		return buf, errStore
	}
	i := sort.Search(len(l.msgs), func(i int) bool { return l.msgs[i].Offset >= from })
	for ; i < len(l.msgs) && max > 0; i++ {
		if l.isResolvedLocked(l.msgs[i].Offset) {
			continue
		}
		buf = append(buf, l.msgs[i])
		max--
	}
	return buf, nil
}

func (l *memLog) Head() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

func (l *memLog) LoadCursor() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cursor, nil
}

func (l *memLog) Resolve(offs []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resolves++
	for _, o := range offs {
		if l.onResolve != nil {
			l.onResolve(o)
		}
		l.pending[o] = true
	}
	l.advanceLocked()
}

// advanceLocked moves the cursor over resolved offsets and gaps.
func (l *memLog) advanceLocked() {
	l.cursor = max(l.cursor, l.floor)
	for l.cursor < l.head {
		n := l.cursor + 1
		if !l.committed[n] && !l.pending[n] && l.hasLocked(n) {
			return
		}
		l.cursor = n
	}
}

// commit makes the pending resolutions durable.
func (l *memLog) commit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for o := range l.pending {
		l.committed[o] = true
	}
	clear(l.pending)
}

// crash forgets the pending resolutions, as a crash before the next commit
// would, and recomputes the cursor from what is left.
func (l *memLog) crash() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.pending)
	l.cursor = 0
	l.advanceLocked()
}

func (l *memLog) DeadLetter(d DeadLetter) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failDead {
		return errStore
	}
	l.dead = append(l.dead, d)
	l.deadAt[d.Message.Offset] = true
	return nil
}

func (l *memLog) persisted() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cursor
}

// isResolved reports whether off is resolved in the log.
func (l *memLog) isResolved(off uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isResolvedLocked(off)
}

func (l *memLog) deadLetters() []DeadLetter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]DeadLetter(nil), l.dead...)
}

// delivery is one call to Deliver or Revoke.
type delivery struct {
	member  string
	offset  uint64
	key     string
	attempt int
}

// recDeliverer records deliveries; members in refuse refuse them. It is for
// single-goroutine use with a core (the loop tests use chanDeliverer).
type recDeliverer struct {
	refuse  map[string]bool
	got     []delivery
	revoked []delivery
	// onDeliver, when set, sees each delivery a member took.
	onDeliver func(d delivery)
	onRevoke  func(d delivery)
}

func newRecDeliverer() *recDeliverer { return &recDeliverer{refuse: make(map[string]bool)} }

func (r *recDeliverer) Deliver(member string, m *Message, attempt int) bool {
	if r.refuse[member] {
		return false
	}
	d := delivery{member: member, offset: m.Offset, key: m.Key, attempt: attempt}
	r.got = append(r.got, d)
	if r.onDeliver != nil {
		r.onDeliver(d)
	}
	return true
}

func (r *recDeliverer) Revoke(member string, offset uint64) {
	d := delivery{member: member, offset: offset}
	r.revoked = append(r.revoked, d)
	if r.onRevoke != nil {
		r.onRevoke(d)
	}
}

// take returns and forgets the deliveries recorded so far.
func (r *recDeliverer) take() []delivery {
	g := r.got
	r.got = nil
	return g
}

// testLogger routes logs to t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// fakeClock is a Clock that moves only when told. Its tickers deliver ticks on
// unbuffered channels, so Advance returns only after the loop has taken every
// tick due; the loop handles a tick before any command sent after that.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTicker{c: make(chan time.Time), period: d, next: c.now.Add(d), stopped: make(chan struct{})}
	c.tickers = append(c.tickers, t)
	return t
}

// Advance moves time forward by d, firing each tick due on the way.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var due *fakeTicker
		for _, t := range c.tickers {
			if !t.isStopped() && !t.next.After(end) && (due == nil || t.next.Before(due.next)) {
				due = t
			}
		}
		if due == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		c.now = due.next
		due.next = due.next.Add(due.period)
		at := c.now
		c.mu.Unlock()
		select {
		case due.c <- at:
		case <-due.stopped:
		}
	}
}

type fakeTicker struct {
	c        chan time.Time
	period   time.Duration
	next     time.Time
	stopOnce sync.Once
	stopped  chan struct{}
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }
func (t *fakeTicker) Stop()               { t.stopOnce.Do(func() { close(t.stopped) }) }
func (t *fakeTicker) isStopped() bool {
	select {
	case <-t.stopped:
		return true
	default:
		return false
	}
}

// fset compiles patterns into a filterSet, for tests.
func fset(patterns ...string) filterSet {
	fs := make(filterSet, len(patterns))
	for i, p := range patterns {
		fs[i] = compileGlob(p)
	}
	return fs
}

// pick returns the index in r.members of the member that owns key, or -1
// when no member may take it (the ring is empty, or no member's filters
// match). It never allocates.
func (r *ring) pick(key string) int { return r.pickFunc(key, nil) }

// stats returns the state's Stats; only the owner of c may call it.
func (c *core) stats() Stats {
	var v [nStats]uint64
	c.fill(&v)
	s := statsFrom(c.cfg.Group, &v)
	for _, m := range c.byRing {
		s.PerMember = append(s.PerMember, MemberStats{ID: m.id, InFlight: m.inflight, Limit: m.limit, Active: m.active})
	}
	return s
}

// patterns returns the source patterns.
func (fs filterSet) patterns() []string {
	out := make([]string, len(fs))
	for i := range fs {
		out[i] = fs[i].pattern
	}
	return out
}

// globMatch reports whether s matches pattern (the dispatcher matches
// compiled globs).
func globMatch(pattern, s string) bool {
	g := compileGlob(pattern)
	return g.match(s)
}
