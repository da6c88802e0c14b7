package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/keyline-mq/keyline/internal/frame"
)

// A message record (the value stored under a client's seq) is:
//
//	version    byte (1)
//	state      byte (stQueued, stSent, stReleased)
//	id         uint16 big-endian (0: not assigned yet)
//	created    uvarint unix seconds
//	deadline   uvarint unix seconds (0: none)
//	expiresAt  uvarint unix seconds the frame's expiry interval stands for (0: none)
//	frame version byte (4 or 5)
//	frame      the encoded PUBLISH, to the end
//
// The session record (PutMeta) is:
//
//	version    byte (1)
//	attached   byte (1 while a connection was attached: messages after
//	           sentTo may have been sent)
//	sentTo     uvarint: every seq <= sentTo was sent at least once
//	next       uvarint: the next seq
const recordVersion = 1

// ErrBadRecord is returned for a stored record that cannot be decoded.
var ErrBadRecord = errors.New("outbox: malformed record")

func nowUnix() int64 { return time.Now().Unix() }

func appendRecord(dst []byte, e *entry) []byte {
	dst = append(dst, recordVersion, e.state)
	dst = binary.BigEndian.AppendUint16(dst, e.id)
	dst = binary.AppendUvarint(dst, uint64(max(e.created, 0)))
	dst = binary.AppendUvarint(dst, uint64(max(e.deadline, 0)))
	dst = binary.AppendUvarint(dst, uint64(max(e.pub.ExpiresAt, 0)))
	dst = append(dst, e.pub.Version)
	return append(dst, e.pub.B...)
}

// recordHeader reads what a message record holds before its frame: state,
// id, created, deadline and the expiry the frame stands for; rest is the
// frame version byte and the frame.
func recordHeader(b []byte) (state uint8, id uint16, vals [3]uint64, rest []byte, err error) {
	if len(b) < 4 || b[0] != recordVersion || b[1] > stReleased {
		return 0, 0, vals, nil, ErrBadRecord
	}
	state, id, b = b[1], binary.BigEndian.Uint16(b[2:]), b[4:]
	for i := range vals {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, 0, vals, nil, ErrBadRecord
		}
		vals[i], b = v, b[n:]
	}
	return state, id, vals, b, nil
}

func decodeRecord(b []byte) (entry, error) {
	var e entry
	state, id, vals, b, err := recordHeader(b)
	if err != nil {
		return e, err
	}
	if len(b) < 1 {
		return e, ErrBadRecord
	}
	p, err := frame.Parse(b[1:], b[0], int64(vals[2]))
	if err != nil {
		return e, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	if p.QoS == 0 {
		return e, fmt.Errorf("%w: QoS 0 message", ErrBadRecord)
	}
	e.pub, e.created, e.deadline, e.state, e.id = p, int64(vals[0]), int64(vals[1]), state, id
	e.sent = e.state != stQueued
	return e, nil
}

func appendMeta(dst []byte, attached bool, sentTo, next uint64) []byte {
	a := byte(0)
	if attached {
		a = 1
	}
	dst = append(dst, recordVersion, a)
	dst = binary.AppendUvarint(dst, sentTo)
	return binary.AppendUvarint(dst, next)
}

func decodeMeta(b []byte) (attached bool, sentTo, next uint64, err error) {
	if len(b) < 2 || b[0] != recordVersion || b[1] > 1 {
		return false, 0, 0, ErrBadRecord
	}
	sentTo, n := binary.Uvarint(b[2:])
	if n <= 0 {
		return false, 0, 0, ErrBadRecord
	}
	next, m := binary.Uvarint(b[2+n:])
	if m <= 0 {
		return false, 0, 0, ErrBadRecord
	}
	return b[1] == 1, sentTo, next, nil
}

// SetPersistent says whether the session outlives its connection: a
// persistent outbox writes its messages to the Store (all of them, when it
// becomes persistent), a transient one deletes them.
func (o *Outbox) SetPersistent(p bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mu.gone || o.cfg.Store == nil || o.mu.persist == p {
		return
	}
	if !p {
		o.loadColdLocked() // before the records go
	}
	o.mu.persist = p
	if !p {
		o.cfg.Store.DeleteSession(o.client)
		return
	}
	for i := o.mu.head; i < len(o.mu.q); i++ {
		if o.mu.q[i].pub != nil {
			o.persistLocked(o.mu.base + uint64(i))
		}
	}
	o.putMetaLocked(o.mu.conn != nil)
}

func (o *Outbox) persistLocked(seq uint64) {
	if !o.mu.persist {
		return
	}
	e := o.entryLocked(seq)
	switch {
	case e == nil:
	case e.inMemory():
		o.cfg.Store.Put(o.client, Stored{Seq: seq, Ref: e.ref, e: e})
	default:
		// Its id or state changed (SetPersistent, PUBREC): the record needs
		// the frame, from the spill file or the record before.
		if rec := o.frameLocked(e, seq); rec != nil {
			o.cfg.Store.Put(o.client, Stored{Seq: seq, Ref: e.ref, e: rec})
		}
	}
}

func (o *Outbox) putMetaLocked(attached bool) {
	if o.mu.persist {
		o.cfg.Store.PutMeta(o.client, appendMeta(nil, attached, o.mu.sentTo, o.mu.next))
	}
}

// Record is one stored message, as a Store returns it.
type Record struct {
	Seq uint64
	Val []byte
}

// Restore loads a persistent outbox's stored state (meta may be nil) into
// an outbox that has held nothing yet. Records must come in seq order. A
// message is marked as sent before (DUP on its next send) when the session
// record says so, or when a connection was attached at the time the records
// were written (it may have been sent). Records that cannot be decoded are
// skipped and returned as errors; the outbox keeps the rest.
func (o *Outbox) Restore(meta []byte, recs []Record) []error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.restoreLocked(meta, len(recs), func(i int) (uint64, entry, error) {
		e, err := decodeRecord(recs[i].Val)
		return recs[i].Seq, e, err
	})
}

// restoreLocked restores n messages, the i-th of which rec returns.
func (o *Outbox) restoreLocked(meta []byte, n int, rec func(i int) (uint64, entry, error)) []error {
	var errs []error
	attached, sentTo, next := false, uint64(0), uint64(1)
	if meta != nil {
		var err error
		if attached, sentTo, next, err = decodeMeta(meta); err != nil {
			errs = append(errs, fmt.Errorf("outbox %q session record: %w", o.client, err))
			attached = true // unknown: assume every message may have been sent
		}
	} else {
		attached = true
	}
	o.mu.persist = o.cfg.Store != nil
	for i := range n {
		seq, e, err := rec(i)
		if err != nil || seq == 0 || (len(o.mu.q) > 0 && seq < o.mu.base+uint64(len(o.mu.q))) {
			if err == nil {
				err = fmt.Errorf("%w: seq %d out of order", ErrBadRecord, seq)
			}
			errs = append(errs, fmt.Errorf("outbox %q message %d: %w", o.client, seq, err))
			continue
		}
		if len(o.mu.q) == 0 {
			o.mu.base = seq
		}
		for o.mu.base+uint64(len(o.mu.q)) < seq {
			o.mu.q = append(o.mu.q, entry{}) // a gap: finished messages
		}
		if _, dupID := o.mu.ids.get(e.id); e.id != 0 && dupID {
			e.id = 0 // assigned again before it is sent
		}
		e.sent = e.sent || seq <= sentTo || attached
		e.stored = true
		if e.sent {
			sentTo = max(sentTo, seq) // kept when the session record is next written
		}
		if !e.isCold() {
			e.size = int32(len(e.pub.B))
			o.mu.mem += int64(e.size)
		} else {
			o.mu.cold++
			o.cfg.Stats.ColdBytes.Add(int64(e.size))
		}
		o.mu.bytes += int64(e.size)
		o.cfg.Stats.Bytes.Add(int64(e.size))
		o.mu.q = append(o.mu.q, e)
		if e.id != 0 {
			o.mu.ids.put(e.id, seq)
		}
		o.mu.live++
		addInfo(o.cfg.Stats.InfoInflight, 1)
	}
	o.mu.next = max(next, o.mu.base+uint64(len(o.mu.q)))
	if len(o.mu.q) == 0 {
		o.mu.base = o.mu.next
	}
	for o.mu.base+uint64(len(o.mu.q)) < o.mu.next {
		o.mu.q = append(o.mu.q, entry{}) // finished messages after the last stored one
	}
	o.mu.sentTo = sentTo
	// Not attached now: say so, so that a crash before the next connection
	// does not take unsent messages for sent ones.
	o.putMetaLocked(false)
	return errs
}

// Cold is what a restored message costs in memory until its session
// resumes: its stored record's figures, not its frame.
type Cold struct {
	Seq      uint64
	state    uint8
	id       uint16
	qos      uint8
	created  int64
	deadline int64
	size     int32
}

// PeekRecord reads the figures of a stored message record (as Store.Put
// wrote it under seq) without keeping any of its bytes.
func PeekRecord(seq uint64, b []byte) (Cold, error) {
	c := Cold{Seq: seq}
	state, id, vals, b, err := recordHeader(b)
	if err != nil {
		return c, err
	}
	// The frame: its version byte, then the PUBLISH (QoS in the fixed header).
	if len(b) < 3 || b[1]>>4 != 3 {
		return c, fmt.Errorf("%w: not a PUBLISH", ErrBadRecord)
	}
	if c.qos = (b[1] >> 1) & 3; c.qos == 0 || c.qos == 3 {
		return c, fmt.Errorf("%w: QoS %d message", ErrBadRecord, c.qos)
	}
	c.state, c.id = state, id
	c.created, c.deadline, c.size = int64(vals[0]), int64(vals[1]), int32(min(len(b)-1, 1<<31-1))
	return c, nil
}

// RestoreCold is Restore for messages kept cold: only their figures are in
// memory (the Store must be a Loader); each frame is read when its message
// is to be sent, or all when the session stops being persistent. Records
// must come in seq order; one out of order is skipped and returned.
func (o *Outbox) RestoreCold(meta []byte, recs []Cold) []error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.cfg.Store.(Loader); !ok {
		return []error{errors.New("outbox: RestoreCold needs a Store that is a Loader")}
	}
	return o.restoreLocked(meta, len(recs), func(i int) (uint64, entry, error) {
		c := recs[i]
		e := entry{pub: cold, state: c.state, id: c.id, qos: c.qos, created: c.created, deadline: c.deadline, size: c.size,
			sent: c.state != stQueued}
		return c.Seq, e, nil
	})
}

// loadColdLocked reads the frames of the cold entries from the store; an
// entry whose record is gone or unreadable is dropped (counted).
func (o *Outbox) loadColdLocked() {
	if o.mu.cold == 0 {
		return
	}
	recs, err := o.cfg.Store.(Loader).Records(o.client)
	byseq := make(map[uint64][]byte, len(recs))
	for _, r := range recs {
		byseq[r.Seq] = r.Val
	}
	var lost []uint64
	for i := o.mu.head; i < len(o.mu.q) && o.mu.cold > len(lost); i++ {
		e := &o.mu.q[i]
		if !e.isCold() {
			continue
		}
		var loaded entry
		seq := o.mu.base + uint64(i)
		val, ok := byseq[seq]
		derr := err
		if ok && derr == nil {
			loaded, derr = decodeRecord(val)
		}
		if !ok || derr != nil {
			lost = append(lost, seq)
			continue
		}
		o.mu.cold--
		o.cfg.Stats.ColdBytes.Add(-int64(e.size))
		o.mu.mem += int64(len(loaded.pub.B))
		o.mu.bytes += int64(len(loaded.pub.B)) - int64(e.size)
		o.cfg.Stats.Bytes.Add(int64(len(loaded.pub.B)) - int64(e.size))
		e.pub, e.size = loaded.pub, int32(len(loaded.pub.B))
	}
	for _, seq := range lost { // finishing may move the queue: by seq
		o.cfg.Stats.LoadErrors.Add(1)
		o.finishLocked(int(seq - o.mu.base))
	}
}

// Queued is a message to load into an outbox with Requeue.
type Queued struct {
	Pub      *frame.Publish // encoded at QoS 1 or 2 for the session's protocol version
	Ref      uint64         // the caller's reference, as for Add
	Created  int64          // unix seconds
	Deadline int64          // unix seconds past which it is dropped unsent; 0: never
	// Sent says the message may have reached the client before (from
	// another node, before a crash): its first send here carries DUP.
	Sent bool
}

// Requeue loads msgs, in their order, into an outbox that has held nothing
// yet: a session rebuilt from a backend that keeps messages elsewhere (the
// cluster replays them from JetStream). Past Max or the byte bounds the
// rest are dropped and counted, as Add does. It returns how many it took.
func (o *Outbox) Requeue(msgs []Queued) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, m := range msgs {
		if m.Pub == nil || m.Pub.QoS == 0 {
			continue
		}
		size := int64(len(m.Pub.B))
		if o.mu.gone || o.mu.live >= o.cfg.Max || (o.cfg.MaxBytes > 0 && o.mu.bytes+size > o.cfg.MaxBytes) ||
			(o.cfg.MaxTotalBytes > 0 && o.cfg.Stats.Bytes.Load()+size > o.cfg.MaxTotalBytes) {
			o.cfg.Stats.Dropped.Add(1)
			addInfo(o.cfg.Stats.InfoDropped, 1)
			o.mu.missed++
			continue
		}
		seq := o.mu.next
		o.mu.next++
		o.mu.q = append(o.mu.q, entry{pub: m.Pub, ref: m.Ref, created: m.Created, deadline: m.Deadline, size: int32(size), sent: m.Sent})
		o.mu.live++
		o.mu.bytes += size
		o.mu.mem += size
		o.cfg.Stats.Bytes.Add(size)
		n++
		o.cfg.Stats.Added.Add(1)
		addInfo(o.cfg.Stats.InfoInflight, 1)
		o.persistLocked(seq)
		o.pumpLocked()
		o.spillLocked(false) // as AddDurable: what cannot be sent now may go off the heap
	}
	o.pumpLocked()
	return n
}

// Renumberer is a Store told when an outbox renumbers its messages
// (Prepend): it forgets the sequences it was given for client, without
// taking them as acknowledged, and the outbox Puts every message again.
type Renumberer interface {
	Renumber(client string)
}

// Prepend loads msgs, in their order, ahead of every message the outbox
// holds: a session rebuilt from a backend that keeps messages elsewhere
// (the cluster replays them from JetStream) while newer messages were
// already being delivered to it. msgs are every message with a reference
// (Ref, non-zero) up to upTo: a held message with such a reference (it
// arrived live during the replay) goes, and so does one Added later. What
// the outbox holds must not have been on a connection yet (no Attach since
// New); the messages are renumbered, after every sequence used before.
// Past Max or the byte bounds the rest of msgs are dropped and counted, as
// Add does. It returns how many it took.
func (o *Outbox) Prepend(msgs []Queued, upTo uint64) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mu.gone {
		return 0
	}
	o.mu.skipTo = max(o.mu.skipTo, upTo)
	var held []entry
	for i := o.mu.head; i < len(o.mu.q); i++ {
		e := o.mu.q[i]
		switch {
		case e.pub == nil:
		case e.ref != 0 && e.ref <= upTo: // replayed: in msgs, in its place
			if e.id != 0 {
				o.mu.ids.del(e.id)
			}
			o.forgetBytesLocked(&e)
			o.mu.live--
			addInfo(o.cfg.Stats.InfoInflight, -1)
		default:
			held = append(held, e)
		}
	}
	o.mu.q, o.mu.head, o.mu.cursor, o.mu.base = nil, 0, 0, o.mu.next
	n := 0
	for _, m := range msgs {
		if m.Pub == nil || m.Pub.QoS == 0 {
			continue
		}
		size := int64(len(m.Pub.B))
		if o.mu.live >= o.cfg.Max || (o.cfg.MaxBytes > 0 && o.mu.bytes+size > o.cfg.MaxBytes) ||
			(o.cfg.MaxTotalBytes > 0 && o.cfg.Stats.Bytes.Load()+size > o.cfg.MaxTotalBytes) {
			o.cfg.Stats.Dropped.Add(1)
			addInfo(o.cfg.Stats.InfoDropped, 1)
			o.mu.missed++
			continue
		}
		o.mu.next++
		o.mu.q = append(o.mu.q, entry{pub: m.Pub, ref: m.Ref, created: m.Created, deadline: m.Deadline, size: int32(size), sent: m.Sent})
		o.mu.live++
		o.mu.bytes += size
		o.cfg.Stats.Bytes.Add(size)
		n++
		o.cfg.Stats.Added.Add(1)
		addInfo(o.cfg.Stats.InfoInflight, 1)
	}
	for _, e := range held {
		seq := o.mu.next
		o.mu.next++
		o.mu.q = append(o.mu.q, e)
		if e.id != 0 {
			o.mu.ids.put(e.id, seq)
		}
	}
	if r, ok := o.cfg.Store.(Renumberer); ok && o.mu.persist {
		r.Renumber(o.client)
	}
	for i := range o.mu.q {
		o.persistLocked(o.mu.base + uint64(i))
	}
	o.pumpLocked()
	return n
}
