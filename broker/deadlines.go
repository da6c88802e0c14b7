package broker

import (
	"sync"
	"time"
)

// deadlineTick is the granularity of the deadlines of event-served
// connections: a keep-alive or CONNECT timeout ends the connection at most
// this long after it passed.
const deadlineTick = 100 * time.Millisecond

// deadlines wakes event-served connections (eventconn.go) whose read deadline
// may have passed, with one timer for all of them instead of a time.Timer
// each (118 B per connection in the heap profile of 10,000 idle connections).
// A connection is put in the bucket of the tick its deadline falls in; the
// timer is armed for the earliest bucket; when a bucket comes due each of its
// connections looks at its deadline then (eventConn.fire) and is put in a
// later bucket if the deadline moved (mochi moves it on every packet).
type deadlines struct {
	mu      sync.Mutex
	buckets map[int64][]firer // by tick (Unix nanoseconds / deadlineTick, rounded up)
	timer   *time.Timer
	armed   int64 // the tick the timer is armed for; 0: not armed
	closed  bool
}

// firer is what deadlines wakes (an *eventConn).
type firer interface{ fire() }

func tickOf(unixNano int64) int64 {
	return (unixNano + int64(deadlineTick) - 1) / int64(deadlineTick)
}

// add makes ec's fire run once at is past (Unix nanoseconds).
func (d *deadlines) add(ec firer, at int64) {
	t := tickOf(at)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if d.buckets == nil {
		d.buckets = make(map[int64][]firer)
	}
	d.buckets[t] = append(d.buckets[t], ec)
	if d.armed == 0 || t < d.armed {
		d.armLocked(t)
	}
}

// remove takes ec out of the bucket of at, where add put it: a connection
// that ended is not kept in memory until then.
func (d *deadlines) remove(ec firer, at int64) {
	t := tickOf(at)
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.buckets[t]
	for i, e := range b {
		if e == ec {
			b[i] = b[len(b)-1]
			b[len(b)-1] = nil
			b = b[:len(b)-1]
			break
		}
	}
	if len(b) == 0 {
		delete(d.buckets, t)
	} else {
		d.buckets[t] = b
	}
}

func (d *deadlines) armLocked(t int64) {
	d.armed = t
	wait := time.Until(time.Unix(0, t*int64(deadlineTick)))
	if d.timer == nil {
		d.timer = time.AfterFunc(wait, d.fire)
		return
	}
	d.timer.Reset(wait)
}

// fire runs the connections of every bucket that is due and arms the timer
// for the next one.
func (d *deadlines) fire() {
	now := time.Now().UnixNano() / int64(deadlineTick)
	var due []firer
	d.mu.Lock()
	next := int64(0)
	for t, b := range d.buckets {
		if t <= now {
			due = append(due, b...)
			delete(d.buckets, t)
		} else if next == 0 || t < next {
			next = t
		}
	}
	d.armed = 0
	if next != 0 && !d.closed {
		d.armLocked(next)
	}
	d.mu.Unlock()
	for _, ec := range due {
		ec.fire()
	}
}

// close stops the timer for good (the broker is stopping; its connections
// have ended).
func (d *deadlines) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed, d.buckets = true, nil
	if d.timer != nil {
		d.timer.Stop()
	}
}
