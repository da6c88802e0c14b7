package hooks

import (
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/frame"
	"github.com/keyline-mq/keyline/internal/outbox"
)

// fanSession is the fan-out's view of one MQTT session: its QoS 1/2 outbox
// and its live connection, if any. It holds no mochi Client, so nothing that
// keeps a session (the route cache) keeps a closed connection alive.
type fanSession struct {
	id string
	// out is the session's outbox, made when the session first needs one
	// (a QoS 1/2 message for it, a Key-Shared packet id; restored sessions
	// come with theirs): an idle device or an offline session that is sent
	// nothing has none (an empty outbox took 288 bytes of the heap of each
	// idle connection and offline session). Read it with outbox, make it
	// with need.
	out atomic.Pointer[outbox.Outbox]
	// cur is the live connection; nil while the client is away (or before
	// its CONNACK is queued: nothing may reach it before that).
	cur atomic.Pointer[sessConn]
	// version is the protocol level messages are encoded for while no
	// connection is live: the last client's.
	version atomic.Uint32
	// window is cur's Receive Maximum.
	window int32

	// mu orders the making of out with attach, detach and discard; the
	// fields below are what out is told when it is made.
	mu       sync.Mutex
	inflight *mqtt.Inflight // the client's in-flight map (outbox.SetExternal)
	persist  bool           // outbox.SetPersistent
	gone     bool           // discarded: an outbox made now refuses everything
}

// outbox returns the session's outbox, nil while it has none.
func (s *fanSession) outbox() *outbox.Outbox { return s.out.Load() }

// need returns the session's outbox, making it (told what the session knows,
// attached to the live connection) if there is none. A discarded session
// gets a discarded outbox, which refuses everything.
func (s *fanSession) need(cfg *outbox.Config) *outbox.Outbox {
	if o := s.out.Load(); o != nil {
		return o
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.out.Load(); o != nil {
		return o
	}
	o := outbox.New(s.id, cfg)
	if s.gone {
		o.Discard()
		return o
	}
	o.SetPersistent(s.persist)
	if s.inflight != nil {
		o.SetExternal(inUse(s.inflight))
	}
	if c := s.cur.Load(); c != nil {
		o.Attach(c, int(s.window))
	}
	s.out.Store(o)
	return o
}

// sessConn is one connection of a session; it sends for the session's outbox.
type sessConn struct {
	q         *connq.Conn
	version   byte
	maxPacket uint32
	// inflight is mochi's in-flight map of this connection's client: the
	// packet ids of Key-Shared deliveries.
	inflight *mqtt.Inflight
}

var _ outbox.Conn = (*sessConn)(nil)

// Send implements outbox.Conn.
func (c *sessConn) Send(p *frame.Publish, id uint16, dup bool, wake func()) error {
	if p.Version != wireVersion(c.version) {
		// Queued for another protocol version than the client's now.
		np, err := reencode(p, c.version)
		if err != nil {
			return err
		}
		p = np
	}
	err := c.q.EnqueueTracked(p, id, dup, wake)
	if errors.Is(err, connq.ErrNoRoom) {
		return outbox.NoRoom
	}
	return err
}

// Release implements outbox.Conn: a PUBREL, success, no properties (valid in
// MQTT 3.1.1 and 5).
func (c *sessConn) Release(id uint16) error {
	_, err := c.q.Write([]byte{packets.Pubrel<<4 | 2, 2, byte(id >> 8), byte(id)})
	return err
}

// Missed implements outbox.Conn.
func (c *sessConn) Missed(n uint64) { c.q.AddMissed(n) }

// wireVersion is the encoding of protocol level v: MQTT 3.1 and 3.1.1
// frames are alike.
func wireVersion(v byte) byte {
	if v < 5 {
		return 4
	}
	return v
}

// inUse reports whether mochi's in-flight map holds id.
func inUse(inflight *mqtt.Inflight) func(id uint16) bool {
	return func(id uint16) bool {
		_, ok := inflight.Get(id)
		return ok
	}
}

// sessionRegistry owns the fan-out sessions, by client id. It is read on
// every acknowledgement and written when sessions begin and end. Maps under
// read-write locks, in shards by the id's hash: one lock had the readers of
// two cores take turns on its reader count's cache line (77 ns a look-up,
// 4.4% of the broker's CPU in a QoS 1 fan-out to 100 subscribers, where
// every PUBACK looks its session up). A sync.Map took some 107 bytes of trie
// nodes per session in the heap profile of 10,000 idle connections, a map
// about 40.
type sessionRegistry struct {
	cfg    *outbox.Config
	seed   maphash.Seed
	shards [registryShards]registryShard
}

const registryShards = 32

type registryShard struct {
	mu sync.RWMutex
	m  map[string]*fanSession // client id -> session
	_  [64 - 24 - 8]byte      // a cache line each: shards read by different cores do not share one
}

func newSessionRegistry(cfg *outbox.Config) *sessionRegistry {
	r := &sessionRegistry{cfg: cfg, seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = make(map[string]*fanSession)
	}
	return r
}

func (r *sessionRegistry) shard(id string) *registryShard {
	return &r.shards[maphash.String(r.seed, id)%registryShards]
}

// get returns the session of client id, or nil.
func (r *sessionRegistry) get(id string) *fanSession {
	sh := r.shard(id)
	sh.mu.RLock()
	s := sh.m[id]
	sh.mu.RUnlock()
	return s
}

// swap makes s the session of id and returns the one it replaced, if any.
func (r *sessionRegistry) swap(id string, s *fanSession) *fanSession {
	sh := r.shard(id)
	sh.mu.Lock()
	old := sh.m[id]
	sh.m[id] = s
	sh.mu.Unlock()
	return old
}

// ensure returns the session of cl, creating it for a client mochi knows
// (connected, or an offline persistent session).
func (r *sessionRegistry) ensure(cl *mqtt.Client) *fanSession {
	s := r.get(cl.ID)
	if s == nil {
		created := false
		sh := r.shard(cl.ID)
		sh.mu.Lock()
		if s = sh.m[cl.ID]; s == nil {
			s, created = &fanSession{id: cl.ID}, true
			sh.m[cl.ID] = s
		}
		sh.mu.Unlock()
		if created {
			s.setPersistent(persistent(cl))
		}
	}
	if s.version.Load() == 0 {
		// New, or restored from the store: now mochi's client is known.
		s.setInflight(cl.State.Inflight)
		s.version.CompareAndSwap(0, uint32(max(cl.Properties.ProtocolVersion, 3)))
	}
	return s
}

// setPersistent says whether the session outlives its connection.
func (s *fanSession) setPersistent(p bool) {
	s.mu.Lock()
	s.persist = p
	o := s.out.Load()
	s.mu.Unlock()
	if o != nil {
		o.SetPersistent(p)
	}
}

// setInflight records the client's in-flight map, whose packet ids the
// outbox must not take.
func (s *fanSession) setInflight(f *mqtt.Inflight) {
	s.mu.Lock()
	s.inflight = f
	o := s.out.Load()
	s.mu.Unlock()
	if o != nil {
		o.SetExternal(inUse(f))
	}
}

// restore adds a session loaded from the store (before any client connects).
func (r *sessionRegistry) restore(id string, out *outbox.Outbox) {
	s := &fanSession{id: id}
	s.out.Store(out)
	r.swap(id, s)
}

// replace discards the session of cl's id, if any, and returns a fresh one
// and whether there was one to discard.
func (r *sessionRegistry) replace(cl *mqtt.Client) (s *fanSession, replaced bool) {
	sh := r.shard(cl.ID)
	sh.mu.Lock()
	old, replaced := sh.m[cl.ID]
	delete(sh.m, cl.ID)
	sh.mu.Unlock()
	if replaced {
		old.discard()
	}
	return r.ensure(cl), replaced
}

// drop discards the session of id if it is s (nil: whatever it is).
func (r *sessionRegistry) drop(id string, s *fanSession) {
	sh := r.shard(id)
	sh.mu.Lock()
	cur := sh.m[id]
	if cur == nil || (s != nil && cur != s) {
		sh.mu.Unlock()
		return
	}
	delete(sh.m, id)
	sh.mu.Unlock()
	cur.discard()
}

// ids returns the client ids of every session.
func (r *sessionRegistry) ids() []string {
	var out []string
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.RLock()
		for k := range sh.m {
			out = append(out, k)
		}
		sh.mu.RUnlock()
	}
	return out
}

func (s *fanSession) discard() {
	s.mu.Lock()
	s.gone = true
	s.inflight = nil // the last client's in-flight map: let it go
	o := s.out.Load()
	s.mu.Unlock()
	s.cur.Store(nil)
	if o != nil {
		o.Discard()
	}
}

// attach makes c the session's live connection and resends what was in
// flight, in order. window is the client's Receive Maximum (0: no limit but
// the outbox's).
func (s *fanSession) attach(c *sessConn, window int, persist bool) {
	s.version.Store(uint32(c.version))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight, s.persist, s.window = c.inflight, persist, int32(min(window, math.MaxInt32))
	o := s.out.Load()
	if o != nil {
		o.SetExternal(inUse(c.inflight))
		o.SetPersistent(persist)
	}
	s.cur.Store(c)
	if o != nil {
		o.Attach(c, window)
	}
}

// detach ends q's connection of the session, if it is the live one.
func (s *fanSession) detach(q *connq.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cur.Load()
	if c == nil || c.q != q {
		return
	}
	s.cur.CompareAndSwap(c, nil)
	if o := s.out.Load(); o != nil {
		o.Detach(c)
	}
}

// RequeueSession implements SessionOutboxes: client id's session, rebuilt
// here by a backend that keeps its messages elsewhere (the cluster replays
// them from JetStream), gets them in its outbox, in order, to be sent once
// the client's CONNACK is out. What the fan-out held for the id before is
// discarded.
func (h *Fanout) RequeueSession(id string, version byte, msgs []outbox.Queued) int {
	o := outbox.New(id, h.sessions.cfg)
	o.SetPersistent(true) // only persistent sessions are rebuilt
	n := o.Requeue(msgs)
	s := &fanSession{id: id}
	s.out.Store(o)
	s.version.Store(uint32(max(version, 3)))
	if old := h.sessions.swap(id, s); old != nil {
		old.discard()
	}
	h.invalidate()
	return n
}

// PrependSession implements SessionOutboxes: msgs go, in order, ahead of
// what client id's session (made by RequeueSession) got meanwhile; they
// are every message it takes with a reference up to upTo.
func (h *Fanout) PrependSession(id string, msgs []outbox.Queued, upTo uint64) int {
	s := h.sessions.get(id)
	if s == nil {
		return 0
	}
	return s.need(h.sessions.cfg).Prepend(msgs, upTo)
}

// RoutesChanged implements SessionOutboxes.
func (h *Fanout) RoutesChanged() { h.invalidate() }

// DropSession implements SessionOutboxes: the session of client id is no
// longer this node's.
func (h *Fanout) DropSession(id string) {
	h.sessions.drop(id, nil)
	h.invalidate()
}
