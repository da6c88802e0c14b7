package broker

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/netpoll"
)

// eventConn is a plain TCP connection served from readiness events
// (package netpoll) instead of a goroutine: while it is idle it holds no
// goroutine, stack or read buffer, only its mochi client, its outbound queue
// (connq.Conn, which starts a writer only while there is something to send),
// its registration and an entry in the broker's deadlines. When bytes arrive a worker reads
// them into a pooled buffer and feeds them to mochi (mqtt.Conn.Feed), which
// keeps only the bytes of an incomplete packet.
//
// Keep-alive and the CONNECT timeout: mochi sets read deadlines through the
// queue (connq.Conn.SetDeadline), which, watched, records them instead of
// arming the socket's own deadline; one timer for all connections
// (deadlines.go: buckets of 100 ms, an entry moved lazily, only when its
// bucket comes early or the deadline moves earlier) wakes the worker when the
// deadline has passed, and the connection ends as a blocked read
// would have ended it (i/o timeout: will sent, OnDisconnect). Trickled bytes
// move no deadline: only whole packets do (mochi refreshes the deadline per
// packet), so a client sending one byte a second, or half a packet, is cut
// at its keep-alive (or CONNECT) timeout and holds at most the bytes it sent.
//
// Closing: whoever closes the client (a DISCONNECT, a takeover, the server
// shutting down, a slow-consumer cut) closes the queue, which tells the
// connection (connq.Conn.Watch): the worker ends it as a blocked read of a
// closed connection would.
type eventConn struct {
	l   *listener
	raw *net.TCPConn
	q   *connq.Conn
	mc  *mqtt.Conn
	pc  atomic.Pointer[netpoll.Conn]

	flags atomic.Uint32 // closingFlag, expiredFlag

	tmu sync.Mutex
	due int64 // Unix nanoseconds of ec's entry in l.deadlines; 0: none

	ended bool // only the worker running Ready touches it
}

const (
	closingFlag = 1 << iota
	expiredFlag
)

// A worker reads into a pooled buffer: a small one first (what an idle
// device sends, a PINGREQ or a publish, fits), a large one once a read fills
// it (a flooding publisher's bytes are then taken 32 KiB per system call).
const (
	smallReadBuf = 2 << 10
	largeReadBuf = 32 << 10
)

var (
	smallReadBufs = sync.Pool{New: func() any { b := make([]byte, smallReadBuf); return &b }}
	largeReadBufs = sync.Pool{New: func() any { b := make([]byte, largeReadBuf); return &b }}
)

// serveEvents starts serving raw from readiness events; false if the
// poller would not take it (closed), the connection then being closed.
func (l *listener) serveEvents(raw *net.TCPConn) bool {
	ec := &eventConn{l: l, raw: raw}
	ec.q = l.queue(raw)
	if !l.track(raw, ec.close) {
		_ = raw.Close()
		return false
	}
	ec.q.AwaitConnack() // a session is attached as its CONNACK is written: its messages go after it
	ec.q.Watch(ec.closing, ec.deadline)
	_ = ec.q.SetDeadline(time.Now().Add(connectTimeout))
	ec.mc = l.server.NewConn(l.id, ec.q)
	pc, err := l.poller.Add(raw, ec)
	if err != nil {
		ec.end(err)
		return false
	}
	if f := l.afterPollerAdd.Load(); f != nil {
		(*f)()
	}
	ec.pc.Store(pc)
	if ec.flags.Load() != 0 {
		pc.Wake()
	}
	return true
}

// close ends the connection from outside (the listener closing): the
// worker finishes it.
func (ec *eventConn) close() { _ = ec.q.Close() }

// closing is connq's close watch (called with the queue's lock held).
func (ec *eventConn) closing() {
	ec.flags.Or(closingFlag)
	if pc := ec.pc.Load(); pc != nil {
		pc.Wake()
	}
}

// Ready reads what has arrived and feeds it to mochi (netpoll.Handler).
func (ec *eventConn) Ready(pc *netpoll.Conn) {
	if ec.ended {
		return
	}
	// Ready can run before serveEvents has recorded the registration (the
	// bytes of a CONNECT arrive as Add returns): record it here too, so that
	// end removes it even when the whole connection ends in that window (a
	// registration left behind holds the client until the broker stops).
	if ec.pc.Load() == nil {
		ec.pc.CompareAndSwap(nil, pc)
	}
	if ec.stopped() {
		return
	}
	bp, pool := smallReadBufs.Get().(*[]byte), &smallReadBufs
	defer func() { pool.Put(bp) }()
	for {
		buf := *bp
		n, err := pc.Read(buf)
		if n > 0 {
			pass, ierr := ec.q.Inspected(buf[:n])
			if ferr := ec.feed(buf[:pass]); ferr != nil {
				ec.end(ferr)
				return
			}
			if ierr != nil {
				ec.end(ec.q.Refuse())
				return
			}
			if n == len(buf) && pool == &smallReadBufs { // more may wait: read on in large pieces
				pool.Put(bp)
				bp, pool = largeReadBufs.Get().(*[]byte), &largeReadBufs
			}
		}
		if errors.Is(err, netpoll.ErrWouldBlock) {
			return
		}
		if err != nil {
			ec.end(err)
			return
		}
		if ec.stopped() {
			return
		}
	}
}

// feed gives mochi one read's packets as a round (connq/round.go): the
// frames its publishes queue for subscribers leave once all are queued, and
// the client's own acknowledgements (its connection corked meanwhile) with
// one write, not one write each.
func (ec *eventConn) feed(b []byte) error {
	ec.q.Cork()
	r := ec.q.BeginRound()
	err := ec.mc.Feed(b)
	ec.q.EndRound(r)
	ec.q.Uncork(1)
	return err
}

// stopped ends the connection if it was closed or its deadline passed.
func (ec *eventConn) stopped() bool {
	f := ec.flags.Load()
	switch {
	case f&closingFlag != 0:
		ec.end(&net.OpError{Op: "read", Net: "tcp", Source: ec.raw.LocalAddr(), Addr: ec.raw.RemoteAddr(), Err: net.ErrClosed})
	case f&expiredFlag != 0:
		ec.end(&net.OpError{Op: "read", Net: "tcp", Source: ec.raw.LocalAddr(), Addr: ec.raw.RemoteAddr(), Err: os.ErrDeadlineExceeded})
	default:
		return false
	}
	return true
}

// end finishes the connection (once): mochi's disconnect steps, then the
// queue flushes and closes; the listener forgets it when that is done.
func (ec *eventConn) end(err error) {
	ec.ended = true
	ec.stopTimer()
	if pc := ec.pc.Load(); pc != nil {
		pc.RemoveBeforeClose() // the queue closes the connection once flushed
	}
	if err := ec.mc.End(err); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, mqtt.ErrClientStopped) {
		ec.l.log.Debug("connection ended", "remote", ec.raw.RemoteAddr().String(), "error", err)
	}
	_ = ec.q.Close() // mochi has closed it already unless CONNECT never came
	ec.q.AfterDone(func() { ec.l.untrack(ec.raw) })
}

// deadline is connq's deadline watch: it puts the connection in the
// deadlines' bucket of its deadline when that comes before the one it is in;
// a later deadline waits until that bucket is due (fire puts it in a later
// one), so a deadline moved on every packet costs nothing here.
func (ec *eventConn) deadline(t time.Time) {
	if t.IsZero() {
		// No MQTT keep-alive: TCP's finds a peer that is gone, as Go's
		// default would have (the listener turns it off for the others).
		_ = ec.raw.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 15 * time.Second, Count: 9})
		return // the entry, if any, finds no deadline and goes
	}
	d := t.UnixNano()
	ec.tmu.Lock()
	if ec.due != 0 && ec.due <= d {
		ec.tmu.Unlock()
		return
	}
	ec.due = d
	ec.tmu.Unlock()
	ec.l.deadlines.add(ec, d)
}

// fire runs when a bucket ec was put in is due: the connection expires if
// its deadline has passed; otherwise it goes in the bucket of its deadline,
// unless a later entry of it already waits there.
func (ec *eventConn) fire() {
	ec.tmu.Lock()
	dl := ec.q.ReadDeadline()
	now := time.Now()
	switch {
	case ec.due == 0:
		ec.tmu.Unlock()
		return
	case dl.IsZero():
		ec.due = 0
		ec.tmu.Unlock()
		return
	case now.Before(dl):
		d := dl.UnixNano()
		if ec.due > now.UnixNano() && ec.due <= d {
			ec.tmu.Unlock() // its entry for ec.due, still to come, covers it
			return
		}
		ec.due = d
		ec.tmu.Unlock()
		ec.l.deadlines.add(ec, d)
		return
	}
	ec.due = 0
	ec.tmu.Unlock()
	ec.flags.Or(expiredFlag)
	if pc := ec.pc.Load(); pc != nil {
		pc.Wake()
	}
}

// stopTimer takes the connection out of the deadlines.
func (ec *eventConn) stopTimer() {
	ec.tmu.Lock()
	due := ec.due
	ec.due = 0
	ec.tmu.Unlock()
	if due != 0 {
		ec.l.deadlines.remove(ec, due)
	}
}
