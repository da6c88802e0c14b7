// Package connq puts one bounded, byte-counted queue and one writer goroutine
// in front of every client connection, so that no caller ever blocks on a
// client's socket.
//
// Three kinds of frame enter the queue:
//   - frames written by mochi through Write (CONNACK, acks, PINGRESP,
//     DISCONNECT, the publishes mochi still tracks): copied, never dropped.
//     If one would take the queue past its hard limit the connection is cut.
//   - shared publishes offered through Enqueue (QoS 0, encoded once for many
//     connections): queued by reference, never copied, and subject to the
//     connection's overflow policy (drop-oldest, drop-newest, disconnect, or
//     conflate: at most the newest message per topic stays queued).
//   - tracked publishes offered through EnqueueTracked (QoS 1 and 2 of a
//     session's outbox): queued by reference with this connection's packet
//     id and DUP flag, never dropped; they are offered only while the queue
//     has room (below the soft limit) and the caller is told when room is back.
//
// Publishes are edited as they are written, by the writer alone: packet id,
// DUP, the remaining Message Expiry Interval, an MQTT 5 topic alias when the
// client allows them, and the drop signal (a user property counting the
// messages this connection missed since the last signal) when asked for.
//
// The writer goroutine runs only while there is something to send: it drains
// up to a byte budget per wakeup and sends it with one writev (net.Buffers)
// on TCP, or one coalesced Write on TLS and WebSocket.
//
// On the read side an optional Inspector sees every byte the client sends
// before the reader does, and can end the connection with a last frame
// (inspect.go).
//
// Invariants:
//   - frames leave in the order they entered (dropped and conflated ones aside);
//   - queued bytes never exceed Limits.Hard (plus the one batch being written);
//   - a mochi frame or a tracked publish is never dropped: it is written, or
//     the connection is closed;
//   - a topic alias is announced (topic and alias) in the first frame that
//     uses it, because the writer assigns aliases in the order it writes.
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
	// Conflate keeps at most the newest queued QoS 0 message per topic (a
	// newer one takes the older one's place in the queue); past the limits
	// it drops the oldest, like DropOldest. A slow reader costs O(topics),
	// not O(rate x time).
	Conflate
)

// Policies names the policies, in value order.
var Policies = enum.Names{"drop-oldest", "drop-newest", "disconnect", "conflate"}

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
	// refused under the policy as if the hard limit were reached. Tracked
	// publishes are offered only while the queue is below it.
	Soft  int
	Grace time.Duration
	// Hard is never exceeded.
	Hard   int
	Policy Policy
}

// roomLimit is the queue size below which tracked publishes are taken.
func (l *Limits) roomLimit() int {
	if l.Soft > 0 {
		return l.Soft
	}
	return l.Hard / 2
}

// Session describes the client behind the connection, for the writer's edits.
type Session struct {
	Version byte // MQTT protocol level: edits that need MQTT 5 need 5
	// MaxPacketSize is the client's Maximum Packet Size (0: no limit): an
	// edit never makes a frame larger than it.
	MaxPacketSize uint32
	// TopicAliasMax is the client's Topic Alias Maximum (MQTT 5): publishes
	// use up to that many aliases, assigned first come, while their topics
	// take at most TopicAliasBytes (0: no limit) in the writer's table.
	TopicAliasMax   uint16
	TopicAliasBytes int
	// DropSignal adds the user property DropSignalProperty to the first
	// publish written after messages were dropped or conflated (MQTT 5).
	DropSignal bool
}

// DropSignalProperty is the user property that carries the drop signal: the
// number of messages this connection missed since the previous signal.
const DropSignalProperty = "dropped"

// ErrSlowConsumer is the cause of a connection cut because its queue overflowed.
var ErrSlowConsumer = errors.New("connq: slow consumer: outbound queue full")

// ErrNoRoom is returned by EnqueueTracked when the queue is at its room
// limit; the publish was not queued and the caller's wake function will be
// called once there is room.
var ErrNoRoom = errors.New("connq: no room for tracked publishes")

// Stats are totals across connections, updated with atomics. The Info*
// pointers, when set, receive the figures of publishes actually written
// (and dropped), so that counters kept elsewhere (mochi's $SYS) stay whole.
type Stats struct {
	DroppedMessages atomic.Uint64 // shared frames dropped by a policy
	DroppedBytes    atomic.Uint64
	Conflated       atomic.Uint64 // shared frames replaced by a newer one of their topic
	SlowDisconnects atomic.Uint64 // connections cut for overflowing
	ProtocolErrors  atomic.Uint64 // connections closed by their Inspector (inspect.go)
	Writes          atomic.Uint64 // writev (or coalesced Write) calls
	DirectWrites    atomic.Uint64 // of which made by a Flusher's caller, not a writer goroutine
	Frames          atomic.Uint64 // frames written
	DropSignals     atomic.Uint64 // drop signals sent
	AbandonedHolds  atomic.Uint64 // held acknowledgements not sent: undecided within HoldCloseTimeout of a close

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

// HoldCloseTimeout bounds how long a closed connection waits for the
// decision of an acknowledgement held on a durable write (Hold): past it the
// held acknowledgements and the frames behind them are not sent, but the
// closing DISCONNECT still is, within FlushTimeout of Close.
const HoldCloseTimeout = FlushTimeout / 2

// Conn is a client connection whose writes are queued.
type Conn struct {
	net.Conn // the underlying connection: reads (but for an Inspector), addresses and deadlines go straight to it

	stats *Stats
	log   *slog.Logger
	raw   rawWriter             // set for direct writes (direct.go)
	now   func() time.Time      // the clock for the soft limit's grace; tests replace it
	round atomic.Pointer[Round] // the round of this connection's reader, while it runs (round.go)

	mu struct {
		sync.Mutex
		q         []entry // q[head:] are queued; a nil b marks a dropped frame
		head      int
		shift     uint64 // q[i] is the frame at absolute position shift+i
		bytes     int    // bytes of the frames in q[head:] not dropped
		limits    Limits
		session   Session
		overSoft  int64  // when bytes last went above Soft (c.now, Unix nanoseconds); zero while under
		scheduled bool   // a writer goroutine is running (at most one is)
		corked    int    // Cork calls not yet undone: the writer is not started (cork.go)
		round     *Round // the round that corked it last (round.go)
		roundGen  uint32 // round's release then
		closing   bool
		failed    error
		holds     []*Hold // holds whose frame has not been written by mochi yet
		// conflate maps a topic to the absolute position of its queued
		// shared frame (policy Conflate only); entries may be stale and are
		// checked against the queue.
		conflate map[string]uint64
		missed   uint64 // messages dropped or conflated since the last drop signal
		wake     func() // called by the writer once tracked publishes fit again
		// connacked is set once mochi wrote the CONNACK: frames queued
		// before (a session attached while its CONNACK is on its way) wait,
		// and the CONNACK goes in front of them.
		connacked bool
		onClose   func()        // Watch: called once when closing starts (events.go)
		afterDone func()        // AfterDone: called once finished
		finished  bool          // the connection is flushed (or failed) and closed
		done      chan struct{} // Done's channel, made when asked for; closed when finished
		// holdTimer ends a closed connection's wait for held
		// acknowledgements (abandonHolds); armed when the writer finds
		// one blocking the queue of a closed connection.
		holdTimer *time.Timer
	}
	// onDeadline (Watch) is told every change of the read deadline; set
	// once before use.
	onDeadline func(time.Time)

	// aliases is the writer's table of topic aliases (topic -> alias), and
	// aliasBytes the bytes of its topics (at most Session.TopicAliasBytes);
	// only the running writer touches them.
	aliases    map[string]uint16
	aliasBytes int

	in inspection // the read side's check, when there is one (inspect.go)

	// readDeadline is the read deadline in force through SetDeadline, in
	// Unix nanoseconds (0: none).
	readDeadline atomic.Int64

	droppedMessages atomic.Uint64
	droppedBytes    atomic.Uint64
	conflated       atomic.Uint64
}

// tcpConn returns the connection when writev is available (a TCP one), nil
// otherwise.
func (c *Conn) tcpConn() *net.TCPConn {
	t, _ := c.Conn.(*net.TCPConn)
	return t
}

// New wraps c; its writer goroutine starts when there is something to
// write. stats may be shared by many connections; log may be nil.
func New(c net.Conn, limits Limits, stats *Stats, log *slog.Logger) *Conn {
	if stats == nil {
		stats = new(Stats)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	q := &Conn{Conn: c, stats: stats, log: log, now: time.Now}
	q.raw = rawOf(c)
	q.mu.limits = limits
	q.mu.connacked = true
	return q
}

// AwaitConnack makes frames queued before the CONNACK wait for it: the
// CONNACK (the first frame Write gets whose type is CONNACK) is sent first.
// Call it before the connection is served.
func (c *Conn) AwaitConnack() {
	c.mu.Lock()
	c.mu.connacked = false
	c.mu.Unlock()
}

// ConflateSendBuffer is the kernel send buffer (SO_SNDBUF) of a TCP
// connection under the conflate policy: what the kernel holds is out of
// conflation's reach, and by default Linux lets it grow to megabytes, which a
// slow reader then gets as stale data first.
const ConflateSendBuffer = 16 << 10

// SetLimits replaces the connection's limits (for example once the client's
// id is known and an override applies).
func (c *Conn) SetLimits(l Limits) {
	c.mu.Lock()
	c.mu.limits = l
	if l.Policy != Conflate {
		c.mu.conflate = nil
	}
	c.mu.Unlock()
	if tcp := c.tcpConn(); l.Policy == Conflate && tcp != nil {
		_ = tcp.SetWriteBuffer(ConflateSendBuffer) // best effort: conflation works without it, later
	}
}

// Limits returns the connection's limits.
func (c *Conn) Limits() Limits {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.limits
}

// SetSession describes the client, once its CONNECT is known and before any
// publish is queued.
func (c *Conn) SetSession(s Session) {
	c.mu.Lock()
	c.mu.session = s
	c.mu.Unlock()
}

// Write queues a copy of p, never dropping it, and returns without waiting
// for the socket. If p would take the queue past the hard limit the
// connection is cut and Write returns ErrSlowConsumer.
func (c *Conn) Write(p []byte) (int, error) {
	if ok, err := c.direct(p, kindMochi, false); ok {
		if err != nil {
			return 0, err
		}
		return len(p), nil
	}
	b := make([]byte, len(p))
	copy(b, p)
	if err := c.queue(entry{b: b}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Send queues a whole MQTT frame the caller encoded, by reference (the
// caller must not modify b afterwards), never dropping it: a message mochi
// does not write itself, counted in mochi's sent figures when written. Past
// the hard limit the connection is cut and Send returns ErrSlowConsumer.
func (c *Conn) Send(b []byte) error {
	if ok, err := c.direct(b, kindSent, true); ok {
		return err
	}
	return c.queue(entry{b: b, kind: kindSent})
}

// queue appends e unless it would take the queue past the hard limit.
func (c *Conn) queue(e entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queueLocked(e, true)
}

// queueLocked is queue; schedule says whether to start the writer (a
// Flusher starts it later).
func (c *Conn) queueLocked(e entry, schedule bool) error {
	if err := c.closedLocked(); err != nil {
		return err
	}
	if c.mu.bytes+len(e.b) > c.mu.limits.Hard {
		c.failLocked(ErrSlowConsumer)
		return ErrSlowConsumer
	}
	if len(c.mu.holds) > 0 {
		c.attachLocked(&e)
		if c.mu.failed != nil {
			return c.mu.failed // the hold failed on MQTT 3.1.1: the connection is cut
		}
	}
	if !c.mu.connacked && e.kind == kindMochi && len(e.b) > 0 && e.b[0]>>4 == 2 {
		c.connackLocked(e)
		return nil
	}
	if !schedule {
		c.mu.q = append(c.mu.q, e)
		c.mu.bytes += len(e.b)
		return nil
	}
	c.pushLocked(e)
	return nil
}

// connackLocked queues the CONNACK ahead of the publishes that wait for it.
func (c *Conn) connackLocked(e entry) {
	c.mu.connacked = true
	c.mu.q = append(c.mu.q, entry{})
	copy(c.mu.q[c.mu.head+1:], c.mu.q[c.mu.head:])
	c.mu.q[c.mu.head] = e
	c.mu.bytes += len(e.b)
	clear(c.mu.conflate) // positions moved; the index starts over
	c.scheduleLocked()
}

func (c *Conn) pushLocked(e entry) {
	c.mu.q = append(c.mu.q, e)
	c.mu.bytes += len(e.b)
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
	c.notifyCloseLocked()
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
	c.notifyCloseLocked()
	_ = c.Conn.SetWriteDeadline(time.Now().Add(FlushTimeout))
	c.scheduleLocked()
	return nil
}

// Done is closed once the writer has exited and the connection is closed.
func (c *Conn) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.finished {
		return closedChan
	}
	if c.mu.done == nil {
		c.mu.done = make(chan struct{}) // made when asked for: most owners use AfterDone
	}
	return c.mu.done
}

var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

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

// Conflated returns the shared frames replaced by a newer one of their topic.
func (c *Conn) Conflated() uint64 { return c.conflated.Load() }

// scheduleLocked starts the writer goroutine unless it is running. The
// writer runs only while there is something to write, so an idle connection
// costs no goroutine.
func (c *Conn) scheduleLocked() {
	if c.mu.corked > 0 && !c.mu.closing && c.mu.failed == nil {
		return // Uncork starts it
	}
	if !c.mu.scheduled {
		c.mu.scheduled = true
		go c.run()
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
		if c.onDeadline != nil {
			c.onDeadline(t)
			return nil
		}
		return c.Conn.SetReadDeadline(t)
	}
	want := t.UnixNano()
	if set := c.readDeadline.Load(); set != 0 && want <= set && set-want <= int64(DeadlineSlack) {
		return nil
	}
	t = t.Add(DeadlineSlack)
	c.readDeadline.Store(t.UnixNano())
	if c.onDeadline != nil {
		c.onDeadline(t)
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

// DeadlineSlack is how much later than asked a read deadline may fall (see SetDeadline).
const DeadlineSlack = time.Second
