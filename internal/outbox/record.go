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

func decodeRecord(b []byte) (entry, error) {
	var e entry
	if len(b) < 4 || b[0] != recordVersion || b[1] > stReleased {
		return e, ErrBadRecord
	}
	e.state = b[1]
	e.id = binary.BigEndian.Uint16(b[2:])
	b = b[4:]
	var vals [3]uint64
	for i := range vals {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return e, ErrBadRecord
		}
		vals[i], b = v, b[n:]
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
	e.pub, e.created, e.deadline = p, int64(vals[0]), int64(vals[1])
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
	if e := o.entryLocked(seq); e != nil {
		o.cfg.Store.Put(o.client, Stored{Seq: seq, Ref: e.ref, e: e})
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
	for _, r := range recs {
		e, err := decodeRecord(r.Val)
		if err != nil || r.Seq == 0 || (len(o.mu.q) > 0 && r.Seq < o.mu.base+uint64(len(o.mu.q))) {
			if err == nil {
				err = fmt.Errorf("%w: seq %d out of order", ErrBadRecord, r.Seq)
			}
			errs = append(errs, fmt.Errorf("outbox %q message %d: %w", o.client, r.Seq, err))
			continue
		}
		if len(o.mu.q) == 0 {
			o.mu.base = r.Seq
		}
		for o.mu.base+uint64(len(o.mu.q)) < r.Seq {
			o.mu.q = append(o.mu.q, entry{}) // a gap: finished messages
		}
		if _, dupID := o.mu.ids.get(e.id); e.id != 0 && dupID {
			e.id = 0 // assigned again before it is sent
		}
		e.sent = e.sent || r.Seq <= sentTo || attached
		if e.sent {
			sentTo = max(sentTo, r.Seq) // kept when the session record is next written
		}
		o.mu.q = append(o.mu.q, e)
		if e.id != 0 {
			o.mu.ids.put(e.id, r.Seq)
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
// cluster replays them from JetStream). Past Max the rest are dropped and
// counted, as Add does. It returns how many it took.
func (o *Outbox) Requeue(msgs []Queued) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, m := range msgs {
		if o.mu.gone || o.mu.live >= o.cfg.Max || m.Pub == nil || m.Pub.QoS == 0 {
			o.cfg.Stats.Dropped.Add(1)
			addInfo(o.cfg.Stats.InfoDropped, 1)
			continue
		}
		seq := o.mu.next
		o.mu.next++
		o.mu.q = append(o.mu.q, entry{pub: m.Pub, ref: m.Ref, created: m.Created, deadline: m.Deadline, sent: m.Sent})
		o.mu.live++
		n++
		o.cfg.Stats.Added.Add(1)
		addInfo(o.cfg.Stats.InfoInflight, 1)
		o.persistLocked(seq)
	}
	o.pumpLocked()
	return n
}
