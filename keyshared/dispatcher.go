package keyshared

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Dispatcher runs the reliable Key-Shared dispatch of one group. One
// goroutine, started by New and ended by Close, owns all dispatch state; the
// methods below talk to it and are safe for concurrent use.
//
// Member changes and Flush send a command and wait for the loop's answer.
// Ack, Nack, Reject and Notify never wait for the loop: acks are queued and
// applied in batches, in the order they were made, before any command that
// is sent after them.
type Dispatcher struct {
	cfg   Config
	clock Clock
	// core is owned by the loop goroutine; no other goroutine touches it.
	core *core

	cmds    chan command
	results resultQueue
	// spare is the loop's second result buffer (loop-owned).
	spare []result
	// notified coalesces Notify calls: set by the first caller, cleared by the
	// loop just before it reads the log.
	notified atomic.Bool
	notifyC  chan struct{}

	closed    atomic.Bool
	closing   chan struct{}
	closeOnce sync.Once
	done      chan struct{}
	// closeErr is the final cursor save's error, written before done closes.
	closeErr error
	wg       sync.WaitGroup

	board board
	// afterIter, when set (tests), runs on the loop after every iteration.
	afterIter func(*core)
}

type cmdKind uint8

const (
	cmdAdd cmdKind = iota + 1
	cmdRemove
	cmdActive
	cmdFlush
	cmdStates
)

type command struct {
	kind   cmdKind
	id     string
	spec   memberSpec
	active bool
	// offsets and states are cmdStates' question and answer (len equal).
	offsets []uint64
	states  []MessageStatus
	reply   chan error
}

type resultKind uint8

const (
	resAck resultKind = iota + 1
	resNack
	resReject
	resReturn
)

// result is a member's answer to a delivery, queued for the loop.
type result struct {
	member string
	offset uint64
	kind   resultKind
	reason byte
}

// resultQueue batches member answers: producers append under a short lock,
// the loop swaps the whole buffer out. It is unbounded, but the hook only
// reports answers to deliveries, of which at most Config.Window are awaited.
type resultQueue struct {
	mu     sync.Mutex
	buf    []result
	signal chan struct{} // capacity 1: "the queue is not empty"
}

func (q *resultQueue) push(r result) {
	q.mu.Lock()
	first := len(q.buf) == 0
	q.buf = append(q.buf, r)
	q.mu.Unlock()
	if first {
		select {
		case q.signal <- struct{}{}:
		default:
		}
	}
}

func (q *resultQueue) take(spare []result) []result {
	q.mu.Lock()
	b := q.buf
	q.buf = spare
	q.mu.Unlock()
	return b
}

// New validates cfg, loads the group's cursor from log and starts the
// dispatch loop, which at once reads whatever the log holds past the cursor.
// Deliveries go out through out. Close stops the loop.
func New(cfg Config, log Log, out Deliverer) (*Dispatcher, error) {
	return start(cfg, log, out, nil)
}

// start is New with a hook the loop calls after every iteration (tests use
// it to check invariants on the live loop).
func start(cfg Config, log Log, out Deliverer, afterIter func(*core)) (*Dispatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil || out == nil {
		return nil, fmt.Errorf("%w: nil Log or Deliverer", ErrInvalidConfig)
	}
	c := newCore(cfg, log, out)
	if err := c.open(); err != nil {
		return nil, err
	}
	d := &Dispatcher{
		cfg:       cfg,
		clock:     cfg.clock(),
		core:      c,
		cmds:      make(chan command),
		results:   resultQueue{signal: make(chan struct{}, 1)},
		notifyC:   make(chan struct{}, 1),
		closing:   make(chan struct{}),
		done:      make(chan struct{}),
		afterIter: afterIter,
	}
	d.board.publish(c)
	d.wg.Add(1)
	go d.run()
	return d, nil
}

// MemberOptions describe a member as AddMember takes it.
type MemberOptions struct {
	// ReceiveMaximum is the client's MQTT Receive Maximum (0: none given); it
	// lowers Config.MemberMaxInflight for this member.
	ReceiveMaximum int
	// KeyFilters are glob patterns ('*', '?') of the keys the member takes;
	// none: every key.
	KeyFilters []string
	// CanRead, when set, reports whether the member may read a topic. A
	// message it may not read is never offered to it: the key goes to the
	// next eligible member on the ring, or waits for one.
	CanRead func(topic string) bool
	// Fits, when set, reports whether the member can take a message (MQTT 5
	// Maximum Packet Size). Like a topic it may not read, a message it cannot
	// take is never offered to it: another member gets it, or it waits.
	Fits func(m *Message) bool
	// Limit is what Fits checks, for a backend whose dispatcher runs on
	// another node than the member (cluster mode): the member's node
	// reports it, and the dispatcher's node makes the same Fits from it.
	Limit PacketLimit
	// QoS is the QoS granted to the member's subscription: what
	// Group.Members shows (the dispatcher does not use it).
	QoS byte
}

// PacketLimit is a member's MQTT 5 Maximum Packet Size and what the size of
// a delivery to it depends on besides the message.
type PacketLimit struct {
	Max            uint32 // the Maximum Packet Size; 0: none
	Version        byte   // the member's MQTT protocol version
	SubscriptionID int    // sent with each delivery (MQTT 5); 0: none
}

// AddMember adds a member (an MQTT client id). Adding a member that exists
// updates its Receive Maximum and filters and marks it active, as a
// re-subscribe does. Invalid filters return an error wrapping
// ErrInvalidFilter and change nothing.
func (d *Dispatcher) AddMember(id string, o MemberOptions) error {
	if id == "" {
		return ErrInvalidMember
	}
	fs, err := compileFilters(o.KeyFilters)
	if err != nil {
		return err
	}
	return d.do(command{kind: cmdAdd, id: id, spec: memberSpec{recvMax: o.ReceiveMaximum, filters: fs, canRead: o.CanRead, fits: o.Fits}})
}

// RemoveMember removes a member that unsubscribed. Its in-flight messages
// are requeued at the head of their keys at once (each counts as a failed
// attempt) and revoked through Deliverer.Revoke. The group and its backlog stay.
func (d *Dispatcher) RemoveMember(id string) error {
	return d.do(command{kind: cmdRemove, id: id})
}

// SetActive marks a member disconnected (false) or reconnected (true). A
// member inactive for Config.EvictAfter heartbeats is evicted like
// RemoveMember; after that SetActive returns ErrUnknownMember and the member
// must be added again.
func (d *Dispatcher) SetActive(id string, active bool) error {
	return d.do(command{kind: cmdActive, id: id, active: active})
}

// Ack reports that member acknowledged offset (PUBACK or PUBCOMP). It does
// not wait for the loop.
func (d *Dispatcher) Ack(member string, offset uint64) error {
	return d.push(result{member: member, offset: offset, kind: resAck})
}

// Nack reports that member answered offset with a failure reason code
// (>= 0x80): the message is retried after backoff, or dead-lettered at once
// if NeverRetry(reason). It does not wait for the loop.
func (d *Dispatcher) Nack(member string, offset uint64, reason byte) error {
	return d.push(result{member: member, offset: offset, kind: resNack, reason: reason})
}

// Reject reports that member refused offset for good: it is dead-lettered
// at once, whatever the poison policy. It does not wait for the loop.
func (d *Dispatcher) Reject(member string, offset uint64, reason byte) error {
	return d.push(result{member: member, offset: offset, kind: resReject, reason: reason})
}

// Return reports that member cannot take offset after all, for a reason
// that is the member's, not the message's: it may not read the message's
// topic, as its CanRead says by now (a check made where the member is, after
// the delivery left). The message goes back to the head of its key as if it
// had never been offered: not counted as an attempt (nor as a delivery), it
// is routed again, to another eligible member or to wait for one. The
// caller makes CanRead refuse the topic before calling Return, or the
// message goes to the member again. It does not wait for the loop.
func (d *Dispatcher) Return(member string, offset uint64) error {
	return d.push(result{member: member, offset: offset, kind: resReturn})
}

func (d *Dispatcher) push(r result) error {
	if d.closed.Load() {
		return ErrClosed
	}
	d.results.push(r)
	return nil
}

// Notify tells the dispatcher that the log has new messages. It never
// blocks and is cheap to call from many publishers at once: calls made
// before the loop gets to the log coalesce into one read.
func (d *Dispatcher) Notify() {
	if d.notified.Load() || !d.notified.CompareAndSwap(false, true) {
		return
	}
	select {
	case d.notifyC <- struct{}{}:
	default:
	}
}

// Flush applies the acks queued so far and hands what they resolved to the
// log now (Log.Resolve).
func (d *Dispatcher) Flush(ctx context.Context) error {
	return d.doCtx(ctx, command{kind: cmdFlush})
}

// Stats returns the group's stats as the loop last published them (after
// each batch of work). It never waits for the loop.
func (d *Dispatcher) Stats() Stats {
	return d.board.load(d.cfg.Group)
}

// Close stops the loop after applying queued acks and handing what they
// resolved to the log. Methods called after Close return ErrClosed. If ctx
// ends first, Close returns ctx.Err() and the loop finishes on its own.
func (d *Dispatcher) Close(ctx context.Context) error {
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		close(d.closing)
	})
	select {
	case <-d.done:
		d.wg.Wait()
		return d.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *Dispatcher) do(cmd command) error {
	return d.doCtx(context.Background(), cmd)
}

func (d *Dispatcher) doCtx(ctx context.Context, cmd command) error {
	if d.closed.Load() {
		return ErrClosed
	}
	cmd.reply = make(chan error, 1)
	select {
	case d.cmds <- cmd:
	case <-d.closing:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-cmd.reply:
		return err
	case <-d.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run is the loop: the only goroutine that touches d.core. It holds a
// heartbeat ticker only while the state has timed work (core.needsTick), so
// an idle group costs no wakeups.
func (d *Dispatcher) run() {
	defer d.wg.Done()
	defer close(d.done)
	var t Ticker
	var ticks <-chan time.Time
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	c := d.core
	flush := func() {}
	if f, ok := c.out.(Flusher); ok {
		flush = f.Flush
	}
	c.poll(d.clock.Now())
	c.flushResolved()
	flush()
	d.board.publish(c)
	for {
		switch need := c.needsTick(); {
		case need && t == nil:
			t = d.clock.NewTicker(d.cfg.Heartbeat)
			ticks = t.C()
		case !need && t != nil:
			t.Stop()
			t, ticks = nil, nil
		}
		var (
			reply chan error
			err   error
			now   time.Time
		)
		select {
		case <-d.closing:
			now = d.clock.Now()
			d.drain(now)
			c.flushResolved()
			flush()
			d.board.publish(c)
			return
		case cmd := <-d.cmds:
			now = d.clock.Now()
			d.drain(now)
			err = d.handle(cmd, now)
			reply = cmd.reply
			c.poll(now)
		case <-d.results.signal:
			now = d.clock.Now()
			d.drain(now)
			c.poll(now)
		case <-d.notifyC:
			now = d.clock.Now()
			d.notified.Store(false)
			c.poll(now)
		case <-ticks:
			now = d.clock.Now()
			d.drain(now)
			c.tick(now)
		}
		c.flushResolved()
		flush()
		d.board.publish(c)
		if d.afterIter != nil {
			d.afterIter(c)
		}
		if reply != nil {
			reply <- err
		}
	}
}

// drain applies the queued member answers.
func (d *Dispatcher) drain(now time.Time) {
	b := d.results.take(d.spare[:0])
	for i := range b {
		r := &b[i]
		switch r.kind {
		case resAck:
			d.core.ack(r.member, r.offset, now)
		case resNack:
			d.core.nack(r.member, r.offset, r.reason, now)
		case resReject:
			d.core.reject(r.member, r.offset, r.reason, now)
		case resReturn:
			d.core.returned(r.member, r.offset, now)
		}
	}
	clear(b)
	d.spare = b[:0]
}

func (d *Dispatcher) handle(cmd command, now time.Time) error {
	c := d.core
	switch cmd.kind {
	case cmdAdd:
		return c.addMember(cmd.id, cmd.spec, now)
	case cmdRemove:
		return c.removeMember(cmd.id, false, now)
	case cmdActive:
		return c.setActive(cmd.id, cmd.active, now)
	case cmdFlush:
		c.flushResolved()
	case cmdStates:
		c.states(cmd.offsets, cmd.states)
	}
	return nil
}
