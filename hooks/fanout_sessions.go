package hooks

import (
	"errors"
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
	id  string
	out *outbox.Outbox
	// cur is the live connection; nil while the client is away (or before
	// its CONNACK is queued: nothing may reach it before that).
	cur atomic.Pointer[sessConn]
	// version is the protocol level messages are encoded for while no
	// connection is live: the last client's.
	version atomic.Uint32
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
// every acknowledgement and written when sessions begin and end. A map under
// a read-write lock: a sync.Map took some 107 bytes of trie nodes per session
// in the heap profile of 10,000 idle connections, a map about 40.
type sessionRegistry struct {
	cfg *outbox.Config
	mu  sync.RWMutex
	m   map[string]*fanSession // client id -> session
}

func newSessionRegistry(cfg *outbox.Config) *sessionRegistry {
	return &sessionRegistry{cfg: cfg, m: make(map[string]*fanSession)}
}

// get returns the session of client id, or nil.
func (r *sessionRegistry) get(id string) *fanSession {
	r.mu.RLock()
	s := r.m[id]
	r.mu.RUnlock()
	return s
}

// swap makes s the session of id and returns the one it replaced, if any.
func (r *sessionRegistry) swap(id string, s *fanSession) *fanSession {
	r.mu.Lock()
	old := r.m[id]
	r.m[id] = s
	r.mu.Unlock()
	return old
}

// ensure returns the session of cl, creating it for a client mochi knows
// (connected, or an offline persistent session).
func (r *sessionRegistry) ensure(cl *mqtt.Client) *fanSession {
	s := r.get(cl.ID)
	if s == nil {
		created := false
		r.mu.Lock()
		if s = r.m[cl.ID]; s == nil {
			s, created = &fanSession{id: cl.ID, out: outbox.New(cl.ID, r.cfg)}, true
			r.m[cl.ID] = s
		}
		r.mu.Unlock()
		if created {
			s.out.SetPersistent(persistent(cl))
		}
	}
	if s.version.Load() == 0 {
		// New, or restored from the store: now mochi's client is known.
		s.out.SetExternal(inUse(cl.State.Inflight))
		s.version.CompareAndSwap(0, uint32(max(cl.Properties.ProtocolVersion, 3)))
	}
	return s
}

// restore adds a session loaded from the store (before any client connects).
func (r *sessionRegistry) restore(id string, out *outbox.Outbox) {
	r.swap(id, &fanSession{id: id, out: out})
}

// replace discards the session of cl's id, if any, and returns a fresh one
// and whether there was one to discard.
func (r *sessionRegistry) replace(cl *mqtt.Client) (s *fanSession, replaced bool) {
	r.mu.Lock()
	old, replaced := r.m[cl.ID]
	delete(r.m, cl.ID)
	r.mu.Unlock()
	if replaced {
		old.discard()
	}
	return r.ensure(cl), replaced
}

// drop discards the session of id if it is s (nil: whatever it is).
func (r *sessionRegistry) drop(id string, s *fanSession) {
	r.mu.Lock()
	cur := r.m[id]
	if cur == nil || (s != nil && cur != s) {
		r.mu.Unlock()
		return
	}
	delete(r.m, id)
	r.mu.Unlock()
	cur.discard()
}

// ids returns the client ids of every session.
func (r *sessionRegistry) ids() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.m))
	for k := range r.m {
		out = append(out, k)
	}
	return out
}

func (s *fanSession) discard() {
	s.cur.Store(nil)
	s.out.Discard()
}

// attach makes c the session's live connection and resends what was in
// flight, in order. window is the client's Receive Maximum (0: no limit but
// the outbox's).
func (s *fanSession) attach(c *sessConn, window int, persist bool) {
	s.version.Store(uint32(c.version))
	s.out.SetExternal(inUse(c.inflight))
	s.out.SetPersistent(persist)
	s.cur.Store(c)
	s.out.Attach(c, window)
}

// detach ends q's connection of the session, if it is the live one.
func (s *fanSession) detach(q *connq.Conn) {
	c := s.cur.Load()
	if c == nil || c.q != q {
		return
	}
	s.cur.CompareAndSwap(c, nil)
	s.out.Detach(c)
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
	s := &fanSession{id: id, out: o}
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
	return s.out.Prepend(msgs, upTo)
}

// RoutesChanged implements SessionOutboxes.
func (h *Fanout) RoutesChanged() { h.invalidate() }

// DropSession implements SessionOutboxes: the session of client id is no
// longer this node's.
func (h *Fanout) DropSession(id string) {
	h.sessions.drop(id, nil)
	h.invalidate()
}
