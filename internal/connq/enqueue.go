package connq

import (
	"time"

	"github.com/keyline-mq/keyline/internal/frame"
)

type entryKind uint8

const (
	kindMochi   entryKind = iota // copied by Write: never dropped
	kindShared                   // a QoS 0 publish by reference: the policy may drop it
	kindTracked                  // a QoS 1/2 publish by reference: never dropped
	kindSent                     // a whole frame by reference (Send): never dropped, counted as a message
)

// entry is one queued frame.
type entry struct {
	b    []byte         // the bytes counted in the queue: mochi's copy, or pub.B
	pub  *frame.Publish // a publish queued by reference
	hold *Hold          // when set and undecided, this frame and all after it wait
	id   uint16         // tracked: packet identifier
	kind entryKind
	dup  bool // tracked: a resend
}

// Enqueue offers a shared QoS 0 publish, queued by reference: p must not
// change afterwards. It reports whether the publish was queued; one that
// does not fit is handled by the connection's policy and counted.
func (c *Conn) Enqueue(p *frame.Publish) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closedLocked() != nil {
		return false
	}
	l := &c.mu.limits
	n := len(p.B)
	if l.Policy == Conflate && c.conflateLocked(p) {
		return true
	}
	if !c.fitsLocked(n) {
		switch l.Policy {
		default: // DropOldest, Conflate, or not set
			c.evictLocked(n)
			if c.mu.bytes+n > l.Hard {
				c.dropLocked(n) // only unsheddable frames are queued, or p alone exceeds the limit
				return false
			}
		case DropNewest:
			c.dropLocked(n)
			return false
		case Disconnect:
			c.dropLocked(n)
			c.failLocked(ErrSlowConsumer)
			return false
		}
	}
	if l.Policy == Conflate {
		if c.mu.conflate == nil {
			c.mu.conflate = map[string]uint64{}
		}
		c.mu.conflate[p.Topic] = c.mu.shift + uint64(len(c.mu.q))
	}
	c.pushLocked(entry{b: p.B, pub: p, kind: kindShared})
	return true
}

// conflateLocked puts p in the place of the queued publish of its topic, if
// there is one (and p fits there), and reports whether it did.
func (c *Conn) conflateLocked(p *frame.Publish) bool {
	pos, ok := c.mu.conflate[p.Topic]
	if !ok {
		return false
	}
	i := int(pos - c.mu.shift)
	if i < c.mu.head || i >= len(c.mu.q) {
		delete(c.mu.conflate, p.Topic)
		return false
	}
	old := &c.mu.q[i]
	if old.b == nil || old.kind != kindShared || old.pub.Topic != p.Topic {
		delete(c.mu.conflate, p.Topic)
		return false
	}
	if grow := len(p.B) - len(old.b); grow > 0 && !c.fitsLocked(grow) {
		return false // too large to take its place: the policy decides
	}
	c.mu.bytes += len(p.B) - len(old.b)
	old.b, old.pub = p.B, p
	// The key is a view into the frame: re-insert it so that it refers to
	// the queued frame, not the replaced one.
	delete(c.mu.conflate, p.Topic)
	c.mu.conflate[p.Topic] = pos
	c.conflated.Add(1)
	c.stats.Conflated.Add(1)
	c.missLocked(1)
	return true
}

// EnqueueTracked queues a QoS 1/2 publish of the session's outbox by
// reference, with this connection's packet id and DUP flag; it is never
// dropped. When the queue is at its room limit (the soft limit) nothing is
// queued, ErrNoRoom is returned and wake is called (once, by the writer, with
// no lock held) when there is room again. Any other error means the
// connection is closed.
func (c *Conn) EnqueueTracked(p *frame.Publish, id uint16, dup bool, wake func()) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.closedLocked(); err != nil {
		return err
	}
	l := &c.mu.limits
	if c.mu.bytes >= l.roomLimit() || (c.mu.bytes > 0 && c.mu.bytes+len(p.B) > l.Hard) {
		c.mu.wake = wake
		return ErrNoRoom
	}
	if len(p.B) > l.Hard {
		c.failLocked(ErrSlowConsumer) // can never be sent
		return ErrSlowConsumer
	}
	c.pushLocked(entry{b: p.B, pub: p, id: id, dup: dup, kind: kindTracked})
	return nil
}

// AddMissed counts n messages the client missed (dropped elsewhere, e.g. by
// a full session outbox), for the drop signal.
func (c *Conn) AddMissed(n uint64) {
	c.mu.Lock()
	c.missLocked(n)
	c.mu.Unlock()
}

func (c *Conn) missLocked(n uint64) {
	if c.mu.session.DropSignal {
		c.mu.missed += n
	}
}

// fitsLocked reports whether n more bytes are within the limits now.
func (c *Conn) fitsLocked(n int) bool {
	l := &c.mu.limits
	after := c.mu.bytes + n
	if after > l.Hard {
		return false
	}
	if l.Soft <= 0 || after <= l.Soft {
		return true
	}
	now := c.now().UnixNano() // only here: reading the clock on every frame costs more than the rest of Enqueue
	if c.mu.overSoft == 0 {
		c.mu.overSoft = now
		return true
	}
	return time.Duration(now-c.mu.overSoft) <= l.Grace
}

// evictLocked drops the oldest shared frames until n more bytes fit under the
// soft limit (or the hard limit, when the soft one is off).
func (c *Conn) evictLocked(n int) {
	l := &c.mu.limits
	target := l.Hard
	if l.Soft > 0 && l.Soft < target {
		target = l.Soft
	}
	for i := c.mu.head; i < len(c.mu.q) && c.mu.bytes+n > target; i++ {
		e := &c.mu.q[i]
		if e.b == nil || e.kind != kindShared {
			continue
		}
		c.forgetTopicLocked(i)
		c.mu.bytes -= len(e.b)
		c.dropLocked(len(e.b))
		e.b, e.pub = nil, nil
	}
	if c.mu.bytes <= l.Soft {
		c.mu.overSoft = 0
	}
}

// forgetTopicLocked removes q[i]'s topic from the conflation index when the
// index points at it.
func (c *Conn) forgetTopicLocked(i int) {
	e := &c.mu.q[i]
	if c.mu.conflate == nil || e.pub == nil {
		return
	}
	if pos, ok := c.mu.conflate[e.pub.Topic]; ok && pos == c.mu.shift+uint64(i) {
		delete(c.mu.conflate, e.pub.Topic)
	}
}

func (c *Conn) dropLocked(n int) {
	c.droppedMessages.Add(1)
	c.droppedBytes.Add(uint64(n))
	c.stats.DroppedMessages.Add(1)
	c.stats.DroppedBytes.Add(uint64(n))
	addInfo(c.stats.InfoMessagesDropped, 1)
	c.missLocked(1)
}
