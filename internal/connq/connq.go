// Package connq puts one bounded, byte-counted queue and one writer goroutine
// in front of every client connection, so that no caller ever blocks on a
// client's socket.
//
// Two kinds of frame enter the queue:
//   - frames written by mochi through Write (CONNACK, acks, QoS 1/2 publishes it
//     tracks, PINGRESP, DISCONNECT): copied, never dropped. If one would take
//     the queue past its hard limit the connection is cut instead.
//   - shared frames offered through Enqueue (QoS 0 publishes encoded once for
//     many connections): queued by reference, never copied, and subject to the
//     connection's overflow policy.
//
// The writer goroutine runs only while there is something to send: it drains
// up to a byte budget per wakeup and sends it with one
// writev (net.Buffers) on TCP, or one coalesced Write on TLS and WebSocket.
//
// On the read side an optional Inspector sees every byte the client sends
// before the reader does, and can end the connection with a last frame
// (inspect.go).
//
// Invariants:
//   - frames leave in the order they entered (dropped ones aside);
//   - queued bytes never exceed Limits.Hard (plus the one batch being written);
//   - a mochi frame is never dropped: it is written, or the connection is closed.
package connq

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/enum"
)

// Policy is what happens to a shared frame that does not fit. The zero value
// means "not set": a queue without a policy drops the oldest frames.
type Policy uint8

const (
	// DropOldest evicts the oldest queued shared frames to make room: the
	// reader sees the newest data (state-like feeds).
	DropOldest Policy = iota + 1
	// DropNewest drops the frame being offered.
	DropNewest
	// Disconnect cuts the connection; the client reconnects and resyncs.
	Disconnect
)

// Policies names the policies, in value order.
var Policies = enum.Names{"drop-oldest", "drop-newest", "disconnect"}

func (p Policy) String() string { return Policies.Name(uint8(p)) }

// ErrUnknownPolicy is returned by ParsePolicy for a name it does not know.
var ErrUnknownPolicy = errors.New("connq: unknown slow-consumer policy")

// ParsePolicy returns the policy with the given name.
func ParsePolicy(name string) (Policy, error) {
	v, err := Policies.Parse("slow-policy", name, ErrUnknownPolicy)
	return Policy(v), err
}

// UnmarshalText parses the policy from YAML and other text formats.
func (p *Policy) UnmarshalText(b []byte) error {
	v, err := ParsePolicy(string(b))
	if err == nil {
		*p = v
	}
	return err
}

// MarshalText prints the policy's name.
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// Set makes *Policy a flag value (pflag.Value).
func (p *Policy) Set(s string) error { return p.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (p *Policy) Type() string { return "policy" }

// Limits bound one connection's queue.
type Limits struct {
	// Soft may be exceeded for at most Grace; after that shared frames are
	// refused under the policy as if the hard limit were reached.
	Soft  int
	Grace time.Duration
	// Hard is never exceeded.
	Hard   int
	Policy Policy
}

// ErrSlowConsumer is the cause of a connection cut because its queue overflowed.
var ErrSlowConsumer = errors.New("connq: slow consumer: outbound queue full")

// Stats are totals across connections, updated with atomics. The Info*
// pointers, when set, receive the figures of shared frames actually written
// (and dropped), so that counters kept elsewhere (mochi's $SYS) stay whole.
type Stats struct {
	DroppedMessages atomic.Uint64 // shared frames dropped by a policy
	DroppedBytes    atomic.Uint64
	SlowDisconnects atomic.Uint64 // connections cut for overflowing
	ProtocolErrors  atomic.Uint64 // connections closed by their Inspector (inspect.go)
	Writes          atomic.Uint64 // writev (or coalesced Write) calls
	Frames          atomic.Uint64 // frames written

	InfoMessagesSent, InfoPacketsSent, InfoBytesSent, InfoMessagesDropped *int64
}

func addInfo(p *int64, n int64) {
	if p != nil {
		atomic.AddInt64(p, n)
	}
}

// BatchBudget is the most bytes the writer takes per wakeup (a single frame
// larger than this goes alone).
const BatchBudget = 256 << 10

// FlushTimeout bounds how long Close waits for queued frames to reach a peer.
const FlushTimeout = time.Second

type frame struct {
	b      []byte
	shared bool  // offered through Enqueue: droppable, counted as a message
	sent   bool  // offered through Send: counted as a message, never dropped
	hold   *Hold // when set and undecided, this frame and all after it wait
}

// Conn is a client connection whose writes are queued.
type Conn struct {
	net.Conn // the underlying connection: reads (but for an Inspector), addresses and deadlines go straight to it

	stats *Stats
	log   *slog.Logger
	tcp   *net.TCPConn     // set when writev is available
	now   func() time.Time // the clock for the soft limit's grace; tests replace it

	mu struct {
		sync.Mutex
		q         []frame // q[head:] are queued; nil b marks a dropped frame
		head      int
		bytes     int // bytes of the frames in q[head:] not dropped
		limits    Limits
		overSoft  time.Time // when bytes last went above Soft; zero while under
		scheduled bool      // a writer goroutine is running (at most one is)
		closing   bool
		failed    error
		holds     []*Hold // holds whose frame has not been written by mochi yet
	}
	done chan struct{} // closed when the connection is finished: flushed (or failed) and closed

	// The writer's buffers, reused across wakeups; only the running writer
	// goroutine touches them.
	wbatch    []frame
	wbufs     net.Buffers
	wcoalesce []byte

	in inspection // the read side's check, when there is one (inspect.go)

	// readDeadline is the read deadline in force through SetDeadline, in
	// Unix nanoseconds (0: none).
	readDeadline atomic.Int64

	droppedMessages atomic.Uint64
	droppedBytes    atomic.Uint64
}

// New wraps c and starts its writer goroutine. stats may be shared by many
// connections; log may be nil.
func New(c net.Conn, limits Limits, stats *Stats, log *slog.Logger) *Conn {
	if stats == nil {
		stats = new(Stats)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	q := &Conn{Conn: c, stats: stats, log: log, now: time.Now, done: make(chan struct{})}
	q.tcp, _ = c.(*net.TCPConn)
	q.mu.limits = limits
	return q
}

// SetLimits replaces the connection's limits (for example once the client's
// id is known and an override applies).
func (c *Conn) SetLimits(l Limits) {
	c.mu.Lock()
	c.mu.limits = l
	c.mu.Unlock()
}

// Limits returns the connection's limits.
func (c *Conn) Limits() Limits {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.limits
}

// Write queues a copy of p, never dropping it, and returns without waiting
// for the socket. If p would take the queue past the hard limit the
// connection is cut and Write returns ErrSlowConsumer.
func (c *Conn) Write(p []byte) (int, error) {
	b := make([]byte, len(p))
	copy(b, p)
	if err := c.queue(frame{b: b}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Send queues a whole MQTT frame the caller encoded, by reference (the
// caller must not modify b afterwards), never dropping it: a message mochi
// does not write itself, counted in mochi's sent figures when written. Past
// the hard limit the connection is cut and Send returns ErrSlowConsumer.
func (c *Conn) Send(b []byte) error {
	return c.queue(frame{b: b, sent: true})
}

// queue appends f unless it would take the queue past the hard limit.
func (c *Conn) queue(f frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.closedLocked(); err != nil {
		return err
	}
	if c.mu.bytes+len(f.b) > c.mu.limits.Hard {
		c.failLocked(ErrSlowConsumer)
		return ErrSlowConsumer
	}
	if len(c.mu.holds) > 0 {
		c.attachLocked(&f)
		if c.mu.failed != nil {
			return c.mu.failed // the hold failed on MQTT 3.1.1: the connection is cut
		}
	}
	c.pushLocked(f)
	return nil
}

// Enqueue offers a shared frame, queued by reference: the caller must not
// modify b afterwards. It reports whether the frame was queued; a frame that
// does not fit is handled by the connection's policy and counted.
func (c *Conn) Enqueue(b []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closedLocked() != nil {
		return false
	}
	l := &c.mu.limits
	if !c.fitsLocked(len(b)) {
		switch l.Policy {
		default: // DropOldest, or not set
			c.evictLocked(len(b))
			if c.mu.bytes+len(b) > l.Hard {
				c.dropLocked(len(b)) // only unsheddable frames are queued, or b alone exceeds the limit
				return false
			}
		case DropNewest:
			c.dropLocked(len(b))
			return false
		case Disconnect:
			c.dropLocked(len(b))
			c.failLocked(ErrSlowConsumer)
			return false
		}
	}
	c.pushLocked(frame{b: b, shared: true})
	return true
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
	now := c.now() // only here: reading the clock on every frame costs more than the rest of Enqueue
	if c.mu.overSoft.IsZero() {
		c.mu.overSoft = now
		return true
	}
	return now.Sub(c.mu.overSoft) <= l.Grace
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
		f := &c.mu.q[i]
		if f.b == nil || !f.shared {
			continue
		}
		c.mu.bytes -= len(f.b)
		c.dropLocked(len(f.b))
		f.b = nil
	}
	if c.mu.bytes <= l.Soft {
		c.mu.overSoft = time.Time{}
	}
}

func (c *Conn) dropLocked(n int) {
	c.droppedMessages.Add(1)
	c.droppedBytes.Add(uint64(n))
	c.stats.DroppedMessages.Add(1)
	c.stats.DroppedBytes.Add(uint64(n))
	addInfo(c.stats.InfoMessagesDropped, 1)
}

func (c *Conn) pushLocked(f frame) {
	c.mu.q = append(c.mu.q, f)
	c.mu.bytes += len(f.b)
	c.scheduleLocked()
}

func (c *Conn) closedLocked() error {
	if c.mu.failed != nil {
		return c.mu.failed
	}
	if c.mu.closing {
		return net.ErrClosed
	}
	return nil
}

// failLocked cuts the connection at once: queued frames are discarded.
func (c *Conn) failLocked(err error) {
	if c.mu.failed != nil {
		return
	}
	c.mu.failed = err
	if errors.Is(err, ErrSlowConsumer) {
		c.stats.SlowDisconnects.Add(1)
		c.log.Warn("disconnecting slow consumer: outbound queue full",
			"remote", c.RemoteAddr().String(), "queued_bytes", c.mu.bytes, "hard_limit", c.mu.limits.Hard)
	}
	// Past deadlines first: closing a TLS connection writes a close_notify,
	// which must not wait on a peer that does not read while c.mu is held.
	_ = c.Conn.SetDeadline(time.Now())
	_ = c.Conn.Close() // ends the reader and any blocked write
	c.scheduleLocked()
}

// Close flushes queued frames (for at most FlushTimeout), then closes the
// underlying connection. It returns at once; Done reports the end.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closing || c.mu.failed != nil {
		return nil
	}
	c.mu.closing = true
	_ = c.Conn.SetWriteDeadline(time.Now().Add(FlushTimeout))
	c.scheduleLocked()
	return nil
}

// Done is closed once the writer has exited and the connection is closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Queued returns the bytes waiting to be written.
func (c *Conn) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.bytes
}

// Dropped returns the shared frames and bytes this connection's policy dropped.
func (c *Conn) Dropped() (messages, bytes uint64) {
	return c.droppedMessages.Load(), c.droppedBytes.Load()
}

// Hold keeps one acknowledgement frame (a PUBACK or PUBREC that mochi is
// about to write) from leaving until a durable write it depends on has
// finished, without blocking mochi: frames queued after it wait behind it, so
// the connection's order is kept. Release lets it go; Fail turns it into a
// failure acknowledgement (MQTT 5) or cuts the connection (MQTT 3.1.1).
type Hold struct {
	c        *Conn
	typ      byte   // MQTT packet type of the frame: 4 PUBACK, 5 PUBREC
	id       uint16 // its packet id
	v5       bool
	replace  []byte // the failure acknowledgement sent instead, once Fail decided it
	attached bool
	decided  bool
	failed   bool
	code     byte
}

// HoldAck holds the next acknowledgement of type typ (4 PUBACK, 5 PUBREC)
// for packet id that is written to c. v5 says whether a failure can be told
// with a reason code.
func (c *Conn) HoldAck(typ byte, id uint16, v5 bool) *Hold {
	h := &Hold{c: c, typ: typ, id: id, v5: v5}
	c.mu.Lock()
	c.mu.holds = append(c.mu.holds, h)
	c.mu.Unlock()
	return h
}

// attachLocked gives f to the pending hold it acknowledges, if any.
func (c *Conn) attachLocked(f *frame) {
	b := f.b
	if len(b) < 4 {
		return
	}
	typ, id := b[0]>>4, uint16(b[2])<<8|uint16(b[3])
	for i, h := range c.mu.holds {
		if h.typ != typ || h.id != id {
			continue
		}
		c.mu.holds = append(c.mu.holds[:i], c.mu.holds[i+1:]...)
		h.attached = true
		if !h.decided {
			f.hold = h
			return
		}
		if h.failed {
			c.failFrameLocked(h)
			if h.replace != nil {
				f.b = h.replace
			}
		}
		return
	}
}

// Release lets the held frame go as mochi wrote it.
func (h *Hold) Release() { h.decide(false, 0) }

// Fail answers the held acknowledgement with reason code instead (MQTT 5),
// or cuts the connection (MQTT 3.1.1, which cannot refuse a publish).
func (h *Hold) Fail(code byte) { h.decide(true, code) }

func (h *Hold) decide(failed bool, code byte) {
	c := h.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.decided {
		return
	}
	h.decided, h.failed, h.code = true, failed, code
	if !h.attached {
		if failed && !h.v5 {
			c.failLocked(errors.New("connq: message not stored; MQTT 3.1.1 cannot refuse it"))
		}
		return // mochi has not written the frame yet: Write applies the decision
	}
	if failed {
		c.failFrameLocked(h)
	}
	c.scheduleLocked()
}

// failFrameLocked prepares the failure acknowledgement that replaces a held
// frame (MQTT 5), or cuts the connection (MQTT 3.1.1).
func (c *Conn) failFrameLocked(h *Hold) {
	if !h.v5 {
		c.failLocked(errors.New("connq: message not stored; MQTT 3.1.1 cannot refuse it"))
		return
	}
	h.replace = []byte{h.typ << 4, 3, byte(h.id >> 8), byte(h.id), h.code}
}

// scheduleLocked starts the writer goroutine unless it is running. The
// writer runs only while there is something to write, so an idle connection
// costs no goroutine.
func (c *Conn) scheduleLocked() {
	if !c.mu.scheduled {
		c.mu.scheduled = true
		go c.run()
	}
}

type takeResult uint8

const (
	takeBatch takeResult = iota // write the batch
	takeIdle                    // nothing to write now: the writer exits until scheduled again
	takeDone                    // closed or failed: finish the connection
)

// take moves up to BatchBudget bytes of frames into batch.
func (c *Conn) take(batch []frame) ([]frame, takeResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.mu.failed != nil || (c.mu.head == len(c.mu.q) && c.mu.closing):
		c.mu.q, c.mu.head, c.mu.bytes = nil, 0, 0
		return batch, takeDone
	case c.mu.head == len(c.mu.q) || c.heldLocked():
		c.mu.scheduled = false // Enqueue, Write, Close or a hold's decision start it again
		return batch, takeIdle
	}
	n := 0
	for c.mu.head < len(c.mu.q) {
		f := c.mu.q[c.mu.head]
		if f.b != nil && n > 0 && n+len(f.b) > BatchBudget {
			break
		}
		if f.hold != nil && !f.hold.decided {
			break // it and everything after it wait for the decision
		}
		c.mu.q[c.mu.head] = frame{}
		c.mu.head++
		if f.b != nil {
			n += len(f.b) // queued bytes were counted with the frame as written
			if f.hold != nil && f.hold.replace != nil {
				f.b = f.hold.replace
			}
			batch = append(batch, f)
		}
	}
	c.mu.bytes -= n
	if c.mu.head == len(c.mu.q) {
		c.mu.q, c.mu.head = c.mu.q[:0], 0
	} else if c.mu.head > 1024 && c.mu.head*2 > len(c.mu.q) {
		c.mu.q = append(c.mu.q[:0], c.mu.q[c.mu.head:]...)
		c.mu.head = 0
	}
	if c.mu.bytes <= c.mu.limits.Soft {
		c.mu.overSoft = time.Time{}
	}
	return batch, takeBatch
}

// heldLocked reports whether the next frame waits for a hold's decision.
func (c *Conn) heldLocked() bool {
	if c.mu.head == len(c.mu.q) {
		return false
	}
	h := c.mu.q[c.mu.head].hold
	return h != nil && !h.decided
}

// run is the writer: it drains the queue, one writev per batch, and exits
// when the queue is empty (or finishes the connection once it is closed).
func (c *Conn) run() {
	for {
		batch, res := c.take(c.wbatch[:0])
		switch res {
		case takeIdle:
			return // touch nothing after this: another writer may start at once
		case takeDone:
			_ = c.Conn.Close()
			close(c.done)
			return
		}
		c.wbatch = batch
		var err error
		if c.tcp != nil {
			c.wbufs = c.wbufs[:0]
			for _, f := range batch {
				c.wbufs = append(c.wbufs, f.b)
			}
			_, err = c.wbufs.WriteTo(c.tcp)
		} else {
			c.wcoalesce = c.wcoalesce[:0]
			for _, f := range batch {
				c.wcoalesce = append(c.wcoalesce, f.b...)
			}
			_, err = c.Conn.Write(c.wcoalesce)
			if cap(c.wcoalesce) > 4*BatchBudget {
				c.wcoalesce = nil // do not pin a one-off huge buffer
			}
		}
		c.account(batch)
		clear(batch) // drop references to shared frames
		if err != nil {
			c.mu.Lock()
			c.failLocked(err) // the next take finishes the connection
			c.mu.Unlock()
		}
	}
}

func (c *Conn) account(batch []frame) {
	c.stats.Writes.Add(1)
	c.stats.Frames.Add(uint64(len(batch)))
	var msgs, bytes int64
	for _, f := range batch {
		if f.shared || f.sent {
			msgs++
			bytes += int64(len(f.b))
		}
	}
	if msgs > 0 {
		addInfo(c.stats.InfoMessagesSent, msgs)
		addInfo(c.stats.InfoPacketsSent, msgs)
		addInfo(c.stats.InfoBytesSent, bytes)
	}
}

// SetDeadline sets the read deadline only (mochi uses it for keepalive):
// write deadlines belong to the writer. mochi moves the deadline forward
// after every packet it reads, and moving a runtime timer is a visible cost
// at high packet rates, so a deadline at most DeadlineSlack earlier than the
// one in force is not passed on; a deadline that is passed on is set
// DeadlineSlack late. The deadline in force is never earlier than asked for,
// and at most DeadlineSlack later.
func (c *Conn) SetDeadline(t time.Time) error {
	if t.IsZero() {
		c.readDeadline.Store(0)
		return c.Conn.SetReadDeadline(t)
	}
	want := t.UnixNano()
	if set := c.readDeadline.Load(); set != 0 && want <= set && set-want <= int64(DeadlineSlack) {
		return nil
	}
	t = t.Add(DeadlineSlack)
	c.readDeadline.Store(t.UnixNano())
	return c.Conn.SetReadDeadline(t)
}

// DeadlineSlack is how much later than asked a read deadline may fall (see SetDeadline).
const DeadlineSlack = time.Second
