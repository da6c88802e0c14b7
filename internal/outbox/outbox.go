// Package outbox keeps one MQTT session's outgoing QoS 1 and 2 messages:
// queued while the client is away or its window is full, in flight until
// acknowledged, resent in their original order after a reconnect (and after
// a restart, from the records it writes to a Store).
//
// An Outbox knows nothing of mochi or of sockets: a Conn sends for it, a
// Store keeps its records, and the caller feeds it the client's
// acknowledgements. Messages are shared encoded frames (frame.Publish);
// each connection patches in the packet id and DUP flag as it writes.
//
// Invariants (checked by the model test after every step):
//  1. messages are sent, and resent after a reconnect, in the order they
//     were added (seq order), with DUP set exactly on those sent before;
//  2. packet ids of live messages are distinct, non-zero once assigned, and
//     never in use outside the outbox (the External check) when assigned;
//  3. at most Window messages are unacknowledged on the current connection;
//  4. every message before the send cursor is on the current connection's
//     wire (awaiting its acknowledgement); none at or after it is;
//  5. at most Max messages, MaxBytes bytes of frames, are held; an Add past
//     either (or past MaxTotalBytes for all outboxes of a Config) is dropped
//     and counted;
//  6. a restored message is held cold (its frame in the Store only, its
//     figures in memory) until it is to be sent, or the session stops being
//     persistent (then every cold message is loaded, in order);
//  7. with a Spill, the frames held in memory exceed its threshold by at most
//     what could not go elsewhere and what waits for its record to commit: a
//     persistent session's frames go cold once their records are committed,
//     the others' to the outbox's spill file (one live record per spilled
//     message); either is read back when it is to be sent (again), or let go
//     unread when it is acknowledged or dropped (offheap.go).
package outbox

import (
	"sync"
	"sync/atomic"

	"github.com/keyline-mq/keyline/internal/frame"
)

// Stats are totals across outboxes, updated with atomics. Info pointers,
// when set, mirror figures kept elsewhere (mochi's $SYS inflight counters).
type Stats struct {
	Added   atomic.Uint64 // messages queued
	Dropped atomic.Uint64 // refused: the outbox held Max messages or MaxBytes, or all held MaxTotalBytes
	Expired atomic.Uint64 // dropped unsent past their deadline
	Resent  atomic.Uint64 // sent again after a reconnect (DUP)
	// Bytes is the frame bytes all outboxes hold (cold ones included);
	// ColdBytes the part of it on disk only.
	Bytes, ColdBytes atomic.Int64
	// LoadErrors counts cold messages that could not be loaded (dropped).
	LoadErrors atomic.Uint64

	InfoInflight, InfoDropped *int64
}

func addInfo(p *int64, n int64) {
	if p != nil {
		atomic.AddInt64(p, n)
	}
}

// Config is what every outbox shares.
type Config struct {
	Max int // messages held at most (queued and unacknowledged)
	// MaxBytes bounds the frame bytes one outbox holds, MaxTotalBytes those
	// of all outboxes of this Config; 0: no bound.
	MaxBytes, MaxTotalBytes int64
	Stats                   *Stats // may be nil
	Store                   Store  // nil: the session is not persisted
	// Spill, when set, takes the frames of queued messages an outbox cannot
	// send now beyond Spill's threshold of bytes in memory (spill.go).
	Spill *Spill
	// Now returns the time in unix seconds (deadlines); nil: the wall clock.
	Now func() int64
}

// Message states.
const (
	stQueued   uint8 = iota // never sent
	stSent                  // PUBLISH sent: awaiting PUBACK (QoS 1) or PUBREC (QoS 2)
	stReleased              // QoS 2: PUBREL sent, awaiting PUBCOMP
)

// entry is one message. A nil pub marks a finished (or dropped) slot, cold
// one whose frame is in the Store, not loaded (invariant 6), and spilled one
// whose frame is in the outbox's spill file (invariant 7).
type entry struct {
	pub      *frame.Publish
	ref      uint64 // the caller's reference of the message (Add)
	created  int64  // unix seconds
	deadline int64  // unix seconds past which an unsent message is dropped; 0: never
	spillOff int64  // spilled: the record's place in the spill file
	spillLen int32
	size     int32 // bytes of the frame, counted against the byte bounds
	id       uint16
	state    uint8
	sent     bool  // sent before: the next send carries DUP
	qos      uint8 // of a cold or spilled entry (pub.QoS otherwise)
	// stored: a record holding the frame is committed in the Store (the
	// frame may go cold).
	stored bool
}

// cold marks an entry whose frame is in the Store only, spilled one whose
// frame is in the spill file only.
var cold, spilled = &frame.Publish{}, &frame.Publish{}

func (e *entry) isCold() bool    { return e.pub == cold }
func (e *entry) isSpilled() bool { return e.pub == spilled }

// inMemory reports whether e holds its frame in memory.
func (e *entry) inMemory() bool { return e.pub != nil && e.pub != cold && e.pub != spilled }

// Outbox is one session's outgoing QoS 1/2 messages. Its methods are safe
// for concurrent use.
type Outbox struct {
	client string
	cfg    *Config

	mu struct {
		sync.Mutex
		q    []entry // q[head:] may be live; q[i] holds the message with seq base+i
		head int
		base uint64  // seq of q[0]
		next uint64  // seq of the next message added
		live int     // messages held
		ids  idTable // packet id -> seq, of live messages with an id
		// bytes is the frame bytes held; cold counts the entries not loaded;
		// mem is the bytes of the frames held in memory (neither cold nor
		// spilled), which a Spill bounds.
		bytes int64
		cold  int
		mem   int64
		// off is the state of frames kept off the heap, made when a
		// Spill first needs it (most outboxes never do).
		off *offHeap

		conn     Conn
		window   int // unacknowledged messages allowed on conn
		cursor   int // q[cursor:] are not on conn's wire; q[head:cursor] live ones are
		inflight int // live messages on conn's wire
		lastID   uint16
		external func(id uint16) bool // ids in use outside the outbox
		missed   uint64               // dropped while no connection was there to tell
		sentTo   uint64               // highest seq ever sent (persisted on Detach)
		gone     bool                 // discarded: refuses everything
		skipTo   uint64               // references up to here came through Prepend
		persist  bool                 // the session outlives its connection: records go to the Store
		wakeFn   func()
	}
}

// New returns an empty outbox for client.
func New(client string, cfg *Config) *Outbox {
	if cfg.Stats == nil {
		cfg.Stats = new(Stats)
	}
	o := &Outbox{client: client, cfg: cfg}
	o.mu.next, o.mu.base = 1, 1
	o.mu.wakeFn = o.wake
	return o
}

func (o *Outbox) now() int64 {
	if o.cfg.Now != nil {
		return o.cfg.Now()
	}
	return nowUnix()
}

// SetExternal sets the check for packet ids in use outside the outbox (the
// session's other in-flight messages); nil: none.
func (o *Outbox) SetExternal(inUse func(id uint16) bool) {
	o.mu.Lock()
	o.mu.external = inUse
	o.mu.Unlock()
}

// Add queues p (encoded at QoS 1 or 2 for the session's protocol version),
// created at unix time created, to be dropped unsent after deadline (0:
// never); ref is the caller's reference of the message, handed to the
// Store (0: none). It reports false when the outbox is full (the message is
// dropped and counted) or discarded.
func (o *Outbox) Add(p *frame.Publish, created, deadline int64, ref uint64) bool {
	added, _ := o.AddDurable(p, created, deadline, ref, nil)
	return added
}

// AddDurable is Add for a message whose publisher waits to hear that it is
// stored: when the session is persistent and its Store a DurableStore, the
// message's record is written with PutDurable, stored hears the outcome,
// and pending is true; otherwise stored is never called. (A message whose
// record failed stays held in memory; its publisher is refused.)
func (o *Outbox) AddDurable(p *frame.Publish, created, deadline int64, ref uint64, stored func(error)) (added, pending bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mu.gone {
		return false, false
	}
	if ref != 0 && ref <= o.mu.skipTo {
		return true, false // held already, from a replay (Prepend)
	}
	size := int64(len(p.B))
	if o.mu.live >= o.cfg.Max || (o.cfg.MaxBytes > 0 && o.mu.bytes+size > o.cfg.MaxBytes) ||
		(o.cfg.MaxTotalBytes > 0 && o.cfg.Stats.Bytes.Load()+size > o.cfg.MaxTotalBytes) {
		o.cfg.Stats.Dropped.Add(1)
		addInfo(o.cfg.Stats.InfoDropped, 1)
		if o.mu.conn != nil {
			o.mu.conn.Missed(1)
		} else {
			o.mu.missed++
		}
		return false, false
	}
	e := entry{pub: p, ref: ref, created: created, deadline: deadline, size: int32(size)}
	e.id = o.allocLocked()
	seq := o.mu.next
	o.mu.next++
	o.mu.q = append(o.mu.q, e)
	o.mu.live++
	o.mu.bytes += size
	o.cfg.Stats.Bytes.Add(size)
	if e.id != 0 {
		o.mu.ids.put(e.id, seq)
	}
	o.mu.mem += size
	o.cfg.Stats.Added.Add(1)
	addInfo(o.cfg.Stats.InfoInflight, 1)
	if ds, ok := o.cfg.Store.(DurableStore); ok && stored != nil && o.mu.persist {
		var committed *committedSeqs // spillLocked takes the notes
		if o.cfg.Spill != nil {
			committed = &o.offLocked().committed
		}
		note := committed != nil
		ds.PutDurable(o.client, Stored{Seq: seq, Ref: ref, e: &o.mu.q[len(o.mu.q)-1]}, func(err error) {
			if err == nil && note {
				committed.note(seq)
			}
			stored(err)
		})
		pending = true
	} else {
		o.persistLocked(seq)
	}
	o.pumpLocked()
	o.spillLocked(pending)
	return true, pending
}

// allocLocked returns a packet id used neither by a live message nor
// outside the outbox, or 0 when none is free.
func (o *Outbox) allocLocked() uint16 {
	id := o.mu.lastID
	for range 65535 {
		if id++; id == 0 {
			id = 1
		}
		if _, used := o.mu.ids.get(id); used {
			continue
		}
		if o.mu.external != nil && o.mu.external(id) {
			continue
		}
		o.mu.lastID = id
		return id
	}
	return 0
}

// entryLocked returns the live message with seq, or nil.
func (o *Outbox) entryLocked(seq uint64) *entry {
	if seq < o.mu.base {
		return nil
	}
	i := int(seq - o.mu.base)
	if i < o.mu.head || i >= len(o.mu.q) || o.mu.q[i].pub == nil {
		return nil
	}
	return &o.mu.q[i]
}

// Attach makes conn the session's connection, allowing window unacknowledged
// messages on it (0: Max). Messages sent before are resent first (DUP set),
// in their original order, then queued ones follow as the window allows.
func (o *Outbox) Attach(conn Conn, window int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mu.gone {
		return
	}
	if window <= 0 {
		window = o.cfg.Max
	}
	o.mu.conn, o.mu.window = conn, window
	o.mu.cursor, o.mu.inflight = o.mu.head, 0
	if o.mu.missed > 0 {
		conn.Missed(o.mu.missed)
		o.mu.missed = 0
	}
	o.putMetaLocked(true)
	o.pumpLocked()
}

// Detach forgets conn (the connection ended) if it is the current one:
// what was in flight on it stays, to be resent on the next Attach.
func (o *Outbox) Detach(conn Conn) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mu.conn != conn || conn == nil {
		return
	}
	o.mu.conn = nil
	o.mu.cursor, o.mu.inflight = o.mu.head, 0
	if o.mu.off != nil {
		o.mu.off.spillScan = o.mu.head // what was on the wire waits to be sent again
	}
	if !o.mu.gone {
		o.putMetaLocked(false)
	}
}

// Attached reports whether a connection is attached.
func (o *Outbox) Attached() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.conn != nil
}

func (o *Outbox) wake() {
	o.mu.Lock()
	o.pumpLocked()
	o.mu.Unlock()
}

// Pump sends what the window allows; callers use it when the window may have
// grown for reasons the outbox does not see.
func (o *Outbox) Pump() { o.wake() }

// pumpLocked sends messages from the cursor while the window and the
// connection's room allow.
func (o *Outbox) pumpLocked() {
	c := o.mu.conn
	if c == nil {
		return
	}
	var now int64
	for o.mu.inflight < o.mu.window && o.mu.cursor < len(o.mu.q) {
		e := &o.mu.q[o.mu.cursor]
		if e.pub == nil {
			o.mu.cursor++
			continue
		}
		if (e.isSpilled() || e.isCold()) && e.state != stReleased {
			if e.state == stQueued && e.deadline > 0 {
				if now == 0 {
					now = o.now()
				}
				if now >= e.deadline {
					o.cfg.Stats.Expired.Add(1)
					o.finishLocked(o.mu.cursor)
					o.mu.cursor++
					continue
				}
			}
			if !o.loadLocked(e, o.mu.base+uint64(o.mu.cursor)) {
				o.finishLocked(o.mu.cursor)
				o.mu.cursor++
				continue
			}
		}
		if e.id == 0 {
			if e.id = o.allocLocked(); e.id == 0 {
				return // every id in use: an acknowledgement frees one
			}
			o.mu.ids.put(e.id, o.mu.base+uint64(o.mu.cursor))
			o.persistLocked(o.mu.base + uint64(o.mu.cursor))
		}
		if e.state == stQueued && e.deadline > 0 {
			if now == 0 {
				now = o.now()
			}
			if now >= e.deadline {
				o.cfg.Stats.Expired.Add(1)
				o.finishLocked(o.mu.cursor)
				o.mu.cursor++
				continue
			}
		}
		var err error
		if e.state == stReleased {
			err = c.Release(e.id)
		} else {
			err = c.Send(e.pub, e.id, e.sent, o.mu.wakeFn)
		}
		if err != nil {
			return // no room (wake comes back), or the connection is gone (Detach comes)
		}
		if e.sent {
			o.cfg.Stats.Resent.Add(1)
		}
		if e.state == stQueued {
			e.state = stSent
		}
		e.sent = true
		seq := o.mu.base + uint64(o.mu.cursor)
		o.mu.sentTo = max(o.mu.sentTo, seq)
		o.mu.cursor++
		o.mu.inflight++
	}
}

// Ack handles an acknowledgement from the client: typ is 4 PUBACK, 5
// PUBREC or 7 PUBCOMP, reason its reason code. It reports whether id is one
// of the outbox's messages (otherwise it belongs to someone else).
func (o *Outbox) Ack(typ byte, id uint16, reason byte) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	seq, ok := o.mu.ids.get(id)
	if !ok {
		return false
	}
	e := o.entryLocked(seq)
	if e == nil {
		return false
	}
	i := int(seq - o.mu.base)
	qos := e.qos // cold or spilled: kept in the entry
	if e.inMemory() {
		qos = e.pub.QoS
	}
	switch {
	case typ == 4 && qos == 1 && e.state == stSent,
		typ == 7 && qos == 2 && e.state == stReleased,
		typ == 5 && qos == 2 && e.state == stSent && reason >= 0x80:
		if i < o.mu.cursor { // on the wire (finishing may move the cursor)
			o.mu.inflight--
		}
		o.finishLocked(i)
		o.pumpLocked()
	case typ == 5 && qos == 2 && (e.state == stSent || e.state == stReleased):
		e.state = stReleased
		o.persistLocked(seq)
		if i < o.mu.cursor && o.mu.conn != nil {
			_ = o.mu.conn.Release(id) // a failure means the connection is gone: resent on reconnect
		}
	}
	return true // ours, even when out of step (a protocol error the client made)
}

// finishLocked removes the live message at q[i].
func (o *Outbox) finishLocked(i int) {
	e := &o.mu.q[i]
	seq, ref := o.mu.base+uint64(i), e.ref
	if e.id != 0 {
		o.mu.ids.del(e.id)
	}
	o.forgetBytesLocked(e)
	*e = entry{}
	o.mu.live--
	addInfo(o.cfg.Stats.InfoInflight, -1)
	if o.mu.persist {
		o.cfg.Store.Delete(o.client, seq, ref)
	}
	for o.mu.head < len(o.mu.q) && o.mu.q[o.mu.head].pub == nil && o.mu.head < o.mu.cursor {
		o.mu.head++
	}
	o.compactLocked()
}

// compactLocked releases the finished slots at the front of the queue.
func (o *Outbox) compactLocked() {
	if o.mu.live == 0 && o.mu.cursor == len(o.mu.q) {
		o.mu.base += uint64(len(o.mu.q))
		o.mu.q, o.mu.head, o.mu.cursor = nil, 0, 0
		if o.mu.off != nil {
			o.mu.off.spillScan = 0
		}
		return
	}
	if o.mu.head >= 1024 && o.mu.head*2 >= len(o.mu.q) {
		n := o.mu.head
		o.mu.q = append(o.mu.q[:0:0], o.mu.q[n:]...)
		o.mu.base += uint64(n)
		o.mu.head, o.mu.cursor = 0, o.mu.cursor-n
		if o.mu.off != nil {
			o.mu.off.spillScan = max(o.mu.off.spillScan-n, 0)
		}
	}
}

// AllocExternal picks a packet id for a message the outbox does not hold
// (another delivery path's), calling set with it while no other id can be
// chosen, so set can record it where External looks. It returns 0 when no
// id is free.
func (o *Outbox) AllocExternal(set func(id uint16)) uint16 {
	o.mu.Lock()
	defer o.mu.Unlock()
	id := o.allocLocked()
	if id != 0 {
		set(id)
	}
	return id
}

// Discard drops every message and the stored records; the outbox refuses
// everything after it.
func (o *Outbox) Discard() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mu.gone {
		return
	}
	o.mu.gone = true
	addInfo(o.cfg.Stats.InfoInflight, -int64(o.mu.live))
	for i := o.mu.head; i < len(o.mu.q); i++ {
		o.forgetBytesLocked(&o.mu.q[i])
	}
	o.mu.q, o.mu.ids, o.mu.live, o.mu.conn = nil, idTable{}, 0, nil
	if o.mu.off != nil && o.mu.off.spill != nil {
		o.mu.off.spill.close()
		o.mu.off.spill = nil
	}
	o.mu.external = nil // it reads the last client's in-flight map: let that go
	o.mu.head, o.mu.cursor, o.mu.inflight = 0, 0, 0
	if o.mu.off != nil {
		o.mu.off.spillScan = 0
	}
	if o.cfg.Store != nil {
		o.cfg.Store.DeleteSession(o.client)
	}
}

// forgetBytesLocked takes e out of the byte counts (and its record out of
// the spill file).
func (o *Outbox) forgetBytesLocked(e *entry) {
	if e.pub == nil {
		return
	}
	o.mu.bytes -= int64(e.size)
	o.cfg.Stats.Bytes.Add(-int64(e.size))
	switch {
	case e.isCold():
		o.mu.cold--
		o.cfg.Stats.ColdBytes.Add(-int64(e.size))
	case e.isSpilled():
		if e.spillLen > 0 && o.mu.off != nil && o.mu.off.spill != nil {
			o.mu.off.spill.release(e.spillOff, e.spillLen)
		}
	default:
		o.mu.mem -= int64(e.size)
	}
}
