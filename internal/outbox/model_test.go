package outbox

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/frame"
)

var (
	seedFlag  = flag.Uint64("outbox.seed", 0, "seed of the randomized model test (0: random)")
	traceFlag = flag.Bool("outbox.trace", false, "log every step of the model test")
)

// publish returns a QoS qos PUBLISH (MQTT 3.1.1) whose payload is n.
func publish(t testing.TB, qos byte, n int) *frame.Publish {
	payload := strconv.Itoa(n)
	b := []byte{0x30 | qos<<1, byte(3 + 2 + len(payload)), 0, 1, 't', 0, 1}
	p, err := frame.Parse(append(b, payload...), 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func msgNo(p *frame.Publish) int {
	n, _ := strconv.Atoi(string(p.Payload()))
	return n
}

// memStore is a Store that applies every write at once.
type memStore struct {
	recs map[uint64][]byte
	meta []byte
}

func (s *memStore) Put(_ string, m Stored)         { s.recs[m.Seq] = m.Record() }
func (s *memStore) Delete(_ string, seq, _ uint64) { delete(s.recs, seq) }
func (s *memStore) PutMeta(_ string, meta []byte)  { s.meta = slices.Clone(meta) }
func (s *memStore) DeleteSession(string)           { clear(s.recs); s.meta = nil }

// Records implements Loader.
func (s *memStore) Records(string) ([]Record, error) { return s.records(), nil }

// Record implements Loader.
func (s *memStore) Record(_ string, seq uint64) ([]byte, error) { return s.recs[seq], nil }

// durableStore is a memStore that is a DurableStore: its records are
// written at once and reported committed when commit runs (a commit of the
// store's committer, later), in order.
// Record reads committed records only, as the session store does.
type durableStore struct {
	*memStore
	pending     []func(error)
	uncommitted map[uint64]bool
}

func (s *durableStore) PutDurable(client string, m Stored, done func(error)) {
	s.Put(client, m)
	if s.uncommitted == nil {
		s.uncommitted = map[uint64]bool{}
	}
	s.uncommitted[m.Seq] = true
	s.pending = append(s.pending, done)
}

func (s *durableStore) Record(client string, seq uint64) ([]byte, error) {
	if s.uncommitted[seq] {
		return nil, nil
	}
	return s.memStore.Record(client, seq)
}

func (s *durableStore) commit() {
	p := s.pending
	s.pending = nil
	clear(s.uncommitted)
	for _, done := range p {
		done(nil)
	}
}

func (s *memStore) records() []Record {
	var out []Record
	for _, seq := range slices.Sorted(maps.Keys(s.recs)) {
		out = append(out, Record{Seq: seq, Val: s.recs[seq]})
	}
	return out
}

// send is what a connection saw.
type send struct {
	n       int // message number
	id      uint16
	dup     bool
	release bool // a PUBREL
}

// fakeConn is a connection with a room switch.
type fakeConn struct {
	sends  []send
	full   bool
	wake   func()
	closed bool
	missed uint64
}

func (c *fakeConn) Send(p *frame.Publish, id uint16, dup bool, wake func()) error {
	if c.closed {
		return fmt.Errorf("closed")
	}
	if c.full {
		c.wake = wake
		return NoRoom
	}
	c.sends = append(c.sends, send{n: msgNo(p), id: id, dup: dup})
	return nil
}

func (c *fakeConn) Release(id uint16) error {
	if c.closed {
		return fmt.Errorf("closed")
	}
	c.sends = append(c.sends, send{id: id, release: true})
	return nil
}

func (c *fakeConn) Missed(n uint64) { c.missed += n }

// model is the client's and the test's view of one session.
type model struct {
	t        *testing.T
	o        *Outbox
	cfg      *Config
	store    *memStore
	conn     *fakeConn
	window   int
	read     int // sends of conn already checked
	external map[uint16]bool

	qos      map[int]byte   // message number -> QoS, for every message added
	sentOnce map[int]bool   // sent at least once
	wire     map[uint16]int // id -> message number, PUBLISHes awaiting an answer on conn
	released map[uint16]int // id -> message number, PUBRELs awaiting PUBCOMP on conn
	relOf    map[uint16]int // id -> message number, QoS 2 messages the client sent PUBREC for
	acked    map[int]bool
	dropped  int
	lastN    int          // last message number sent on conn (order)
	maybeDup map[int]bool // may carry DUP without having been sent (restored after a crash while attached)
}

func (m *model) checkSends() {
	t := m.t
	if m.conn == nil {
		return
	}
	for _, s := range m.conn.sends[m.read:] {
		if s.release {
			n, ok := m.relOf[s.id]
			if !ok || m.acked[n] {
				t.Fatalf("PUBREL %d for no released message", s.id)
			}
			m.released[s.id] = n
			continue
		}
		if s.id == 0 || m.external[s.id] {
			t.Fatalf("message %d sent with packet id %d (external in use: %v)", s.n, s.id, m.external[s.id])
		}
		if other, busy := m.wire[s.id]; busy {
			t.Fatalf("message %d sent with id %d, still in use by message %d", s.n, s.id, other)
		}
		if s.n <= m.lastN {
			t.Fatalf("message %d sent after message %d on one connection: out of order", s.n, m.lastN)
		}
		if s.dup != m.sentOnce[s.n] && !(s.dup && m.maybeDup[s.n]) {
			t.Fatalf("message %d sent with DUP=%v; sent before: %v", s.n, s.dup, m.sentOnce[s.n])
		}
		if m.acked[s.n] {
			t.Fatalf("message %d sent after its acknowledgement", s.n)
		}
		m.lastN = s.n
		m.sentOnce[s.n] = true
		m.wire[s.id] = s.n
	}
	m.read = len(m.conn.sends)
	if n := len(m.wire) + len(m.released); n > m.window {
		t.Fatalf("%d messages unacknowledged on the connection, window %d", n, m.window)
	} else if _, inflight := m.o.Len(); inflight != n {
		t.Fatalf("the outbox counts %d messages in flight, the client %d", inflight, n)
	}
}

// checkStore compares the stored records with the messages held, and the
// spill file with the spilled messages (invariant 7).
func (m *model) checkStore(run, step int) {
	m.o.mu.Lock()
	defer m.o.mu.Unlock()
	held := map[uint64]bool{}
	var mem int64
	spilled := 0
	for i := m.o.mu.head; i < len(m.o.mu.q); i++ {
		e := &m.o.mu.q[i]
		if e.pub != nil {
			held[m.o.mu.base+uint64(i)] = true
		}
		if e.inMemory() {
			mem += int64(e.size)
		}
		if e.isSpilled() {
			spilled++
		}
	}
	if mem != m.o.mu.mem {
		m.t.Fatalf("run %d step %d: frames in memory %d bytes, counted %d", run, step, mem, m.o.mu.mem)
	}
	if live, sf := 0, m.o.spillFile(); sf != nil || spilled > 0 {
		if sf != nil {
			live = sf.live
		}
		if live != spilled {
			m.t.Fatalf("run %d step %d: %d messages spilled, %d records live in the spill file", run, step, spilled, live)
		}
	}

	for seq := range m.store.recs {
		if !held[seq] {
			m.t.Fatalf("run %d step %d: record %d stored but not held", run, step, seq)
		}
	}
	for seq := range held {
		if _, ok := m.store.recs[seq]; !ok {
			m.t.Fatalf("run %d step %d: message %d held but not stored", run, step, seq)
		}
	}
}

func (m *model) attach(window int) {
	m.conn = &fakeConn{}
	m.read, m.lastN, m.window = 0, -1, window
	m.wire, m.released = map[uint16]int{}, map[uint16]int{}
	m.o.Attach(m.conn, window)
}

func (m *model) detach() {
	m.conn.closed = true
	m.o.Detach(m.conn)
	m.conn = nil
	m.wire, m.released = map[uint16]int{}, map[uint16]int{}
}

// ack answers one message on the wire as a client would.
func (m *model) ack(r *rand.Rand) {
	if len(m.wire)+len(m.released) == 0 {
		return
	}
	if len(m.released) > 0 && (len(m.wire) == 0 || r.IntN(2) == 0) {
		id := slices.Sorted(maps.Keys(m.released))[r.IntN(len(m.released))]
		n := m.released[id]
		delete(m.released, id)
		m.o.Ack(7, id, 0)
		m.acked[n] = true
		delete(m.relOf, id)
		return
	}
	ids := slices.Sorted(maps.Keys(m.wire))
	id := ids[0]
	if r.IntN(4) == 0 {
		id = ids[r.IntN(len(ids))] // out of order
	}
	n := m.wire[id]
	delete(m.wire, id)
	switch {
	case m.qos[n] == 1:
		m.o.Ack(4, id, 0)
		m.acked[n] = true
	case r.IntN(10) == 0:
		m.o.Ack(5, id, 0x80) // refused: the flow ends
		m.acked[n] = true
	default:
		m.relOf[id] = n
		if !m.o.Ack(5, id, 0) {
			m.t.Fatalf("PUBREC %d not taken", id)
		}
	}
}

// TestOutboxModel drives an outbox with random adds, acknowledgements,
// reconnects, full connections, ids taken by other deliveries, crashes and restarts, checking
// the invariants after every step and that nothing is lost at the end.
func TestOutboxModel(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -outbox.seed=%d)", seed, seed)
	var spilledTotal, cooledTotal uint64
	defer func() {
		if !t.Failed() && (spilledTotal == 0 || cooledTotal == 0) {
			t.Errorf("%d messages spilled, %d went cold: the spill is not exercised", spilledTotal, cooledTotal)
		}
	}()
	for run := range 40 {
		r := rand.New(rand.NewPCG(seed, uint64(run)))
		store := &memStore{recs: map[uint64][]byte{}}
		steps, maxHeld := 600, 1+r.IntN(60)
		if run < 2 { // long enough for the queue to compact (1,024 finished slots)
			steps, maxHeld = 8000, 1500
		}
		cfg := &Config{Max: maxHeld, Store: store, Now: func() int64 { return 1000 }}
		var durable *durableStore
		if run%4 >= 2 { // messages written with PutDurable, committed later: past the threshold they go cold
			durable = &durableStore{memStore: store}
			cfg.Store = durable
		}
		if run%2 == 1 { // frames past a few in memory go to a spill file
			sp, err := NewSpill(t.TempDir(), int64(8+r.IntN(60)))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Spill = sp
		}
		m := &model{t: t, cfg: cfg, store: store, external: map[uint16]bool{},
			qos: map[int]byte{}, relOf: map[uint16]int{}, sentOnce: map[int]bool{}, acked: map[int]bool{}, maybeDup: map[int]bool{}}
		m.o = New("c", cfg)
		m.o.SetPersistent(true)
		m.o.SetExternal(func(id uint16) bool { return m.external[id] })
		next := 0
		for step := range steps {
			op := r.IntN(100)
			switch {
			case op < 35:
				q := byte(1 + r.IntN(2))
				m.qos[next] = q
				added := false
				if durable != nil {
					added, _ = m.o.AddDurable(publish(t, q, next), 1000, 0, 0, func(error) {})
				} else {
					added = m.o.Add(publish(t, q, next), 1000, 0, 0)
				}
				if !added {
					m.dropped++
					m.acked[next] = true // never to be delivered
				}
				next++
				if durable != nil && r.IntN(4) == 0 {
					durable.commit()
				}
			case op < 65 && m.conn != nil:
				m.ack(r)
			case op < 72 && m.conn != nil:
				m.detach()
			case op < 80 && m.conn == nil:
				m.attach(1 + r.IntN(20))
			case op < 85 && m.conn != nil:
				m.conn.full = !m.conn.full
				if !m.conn.full && m.conn.wake != nil {
					w := m.conn.wake
					m.conn.wake = nil
					w()
				}
			case op < 94:
				// Another delivery path (Key-Shared) takes an id for a
				// message of its own.
				if id := m.o.AllocExternal(func(id uint16) { m.external[id] = true }); id != 0 {
					if _, live := m.o.mu.ids.get(id); live {
						t.Fatalf("run %d step %d: external id %d is a live message's", run, step, id)
					}
				}
			case op < 96 && len(m.external) > 0:
				for id := range m.external { // mochi's message acknowledged
					delete(m.external, id)
					break
				}
			case op < 98:
				// Crash and restart: a new outbox from the store.
				wasAttached := m.conn != nil
				if m.conn != nil {
					m.conn.closed = true
					m.conn = nil
				}
				for n := range m.qos {
					if wasAttached && !m.acked[n] {
						m.maybeDup[n] = true
					}
				}
				m.o.mu.Lock()
				if sf := m.o.spillFile(); sf != nil { // the process is gone: so is its spill file
					sf.close()
					m.o.mu.off.spill = nil
				}
				m.o.mu.Unlock()
				if durable != nil {
					durable.commit() // what the store wrote before the crash (the fake writes at once)
				}
				m.o = New("c", cfg)
				var errs []error
				if op%2 == 0 {
					errs = m.o.Restore(store.meta, store.records())
				} else { // cold: figures now, frames when a connection comes
					var cs []Cold
					for _, r := range store.records() {
						c, err := PeekRecord(r.Seq, r.Val)
						if err != nil {
							t.Fatalf("run %d step %d: peek record %d: %v", run, step, r.Seq, err)
						}
						cs = append(cs, c)
					}
					errs = m.o.RestoreCold(store.meta, cs)
				}
				if len(errs) > 0 {
					t.Fatalf("run %d step %d: restore: %v", run, step, errs)
				}
				m.o.SetExternal(func(id uint16) bool { return m.external[id] })
				m.wire, m.released = map[uint16]int{}, map[uint16]int{}
			}
			m.checkSends()
			if step%8 == 0 || op >= 90 {
				m.checkStore(run, step)
			}
			if *traceFlag {
				held, infl := m.o.Len()
				t.Logf("run %d step %d op %d: held %d inflight %d conn %v sends %v meta %v ids %v", run, step, op, held, infl, m.conn != nil, func() any {
					if m.conn != nil {
						return m.conn.sends
					}
					return nil
				}(), m.store.meta, m.o.mu.ids.len())
			}
		}
		// Drain: attach without limits and acknowledge everything.
		clear(m.external)
		if m.conn != nil {
			m.detach()
		}
		m.attach(cfg.Max)
		if *traceFlag {
			t.Logf("drain: meta %v held %v", m.store.meta, fmt.Sprint(m.o.Len()))
		}
		for range 10 * next {
			m.checkSends()
			if len(m.wire)+len(m.released) == 0 {
				break
			}
			m.ack(r)
		}
		m.checkSends()
		for n := range next {
			if !m.acked[n] {
				t.Fatalf("run %d: message %d (qos %d) never acknowledged; held %v", run, n, m.qos[n], fmt.Sprint(m.o.Len()))
			}
		}
		if held, _ := m.o.Len(); held != 0 || len(store.recs) != 0 {
			t.Fatalf("run %d: %d held, %d stored after draining", run, held, len(store.recs))
		}
		if sp := cfg.Spill; sp != nil {
			spilledTotal += sp.Spilled.Load()
			cooledTotal += sp.Cooled.Load()
			if sp.Bytes.Load() != 0 {
				t.Fatalf("run %d: spill holds %d bytes after draining (spilled %d)", run, sp.Bytes.Load(), sp.Spilled.Load())
			}
			m.o.Discard()
			if n := sp.files.Load(); n != 0 {
				t.Fatalf("run %d: %d spill files open after the outbox was discarded", run, n)
			}
		}
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	p := publish(t, 2, 42)
	e := entry{pub: p, created: 77, deadline: 99, id: 513, state: stReleased, sent: true}
	got, err := decodeRecord(appendRecord(nil, &e))
	if err != nil {
		t.Fatal(err)
	}
	if got.id != 513 || got.state != stReleased || !got.sent || got.created != 77 || got.deadline != 99 || msgNo(got.pub) != 42 {
		t.Fatalf("decoded %+v", got)
	}
	for _, bad := range [][]byte{nil, {2, 0, 0, 1}, {1, 9, 0, 1, 0, 0, 0, 4}, append(appendRecord(nil, &e)[:8], 4, 0x30)} {
		if _, err := decodeRecord(bad); err == nil {
			t.Errorf("decodeRecord(% x) accepted", bad)
		}
	}
	a, s, n, err := decodeMeta(appendMeta(nil, true, 1<<40, 7))
	if err != nil || !a || s != 1<<40 || n != 7 {
		t.Fatalf("meta %v %d %d %v", a, s, n, err)
	}
}
