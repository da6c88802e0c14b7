package netpoll

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrWouldBlock is returned by Conn.Read when no bytes are waiting.
var ErrWouldBlock = errors.New("netpoll: no bytes to read now")

// ErrUnsupported is returned by New where there is no epoll (not Linux).
var ErrUnsupported = errors.New("netpoll: not supported on this system")

var errEOF = io.EOF

// ErrClosed is returned by Add on a closed Poller.
var ErrClosed = errors.New("netpoll: poller closed")

// Handler reacts to a connection's readiness. Ready runs in a waiter or a
// worker goroutine, never in two at once for one connection (see the
// package doc); it may block (the connection waits, others do not), but
// while it runs it holds that goroutine.
type Handler interface {
	Ready(c *Conn)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(*Conn)

// Ready calls f(c).
func (f HandlerFunc) Ready(c *Conn) { f(c) }

// Stats are a Poller's counters.
type Stats struct {
	Conns  atomic.Int64  // registered now
	Events atomic.Uint64 // readiness events taken from epoll
	Runs   atomic.Uint64 // Handler runs
	Reads  atomic.Uint64 // read system calls
	// Skipped counts reads answered ErrWouldBlock without a system call:
	// the read before them in the same run came back short (see Conn.Read).
	Skipped atomic.Uint64
	Spawned atomic.Uint64 // goroutines started because every waiter or worker was busy
	// Rescues counts waiters the watchdog started: a proven Handler ran
	// for a watchdog tick with no waiter left waiting (see Config.Waiters).
	Rescues atomic.Uint64
}

// Conn is a connection registered with a Poller.
type Conn struct {
	p     *Poller
	rc    syscall.RawConn
	h     Handler
	token uint64
	state atomic.Uint32 // running | pending | paused | hungUp

	// unproven counts down the quick runs the Handler must still make
	// before a waiter runs it without a spare waiter waiting (see
	// Config.Waiters); a slow run starts it over. Only the goroutine that
	// holds the running state touches it.
	unproven uint8

	// drained: a read of this run came back short, so the kernel held no
	// more bytes then (only the running Handler's goroutine touches it).
	drained bool
}

const (
	running = 1 << iota
	pending
	paused
	hungUp // an event reported the peer's close or an error: read until EOF
)

// event is one readiness event taken from epoll.
type event struct {
	token  uint64
	hangup bool // EPOLLRDHUP, EPOLLHUP or EPOLLERR
}

// Config tunes a Poller; the zero value is usable.
type Config struct {
	// Waiters is how many goroutines wait on epoll (default 1). A waiter
	// runs the Handlers of the connections it finds ready itself, with no
	// hand-off to another goroutine. A Handler may block (a durable publish,
	// a cluster call, a session restored on CONNECT), and while it does, the
	// others' events would wait: so before a waiter runs a Handler that has
	// not proven quick (provenRuns runs in a row under slowRun each; a new
	// connection's CONNECT has not), it makes sure another waiter waits,
	// starting one when none is free; the extra ones exit once the others
	// are back. A proven Handler runs with nobody waiting meanwhile: a
	// second waiter queued for the epoll descriptor would be woken (another
	// thread) at every event only to find none, which was a third of the
	// broker's CPU for idle devices publishing once every 10 s. If a proven
	// Handler blocks after all, a watchdog that ticks every watchdogTick
	// while Handlers run starts a waiter once it sees a run go on for a tick
	// with none waiting (Stats.Rescues): the others' events then wait at most
	// about two ticks.
	Waiters int
	// Workers is how many goroutines wait to run Handlers woken by Wake or
	// Resume (a timeout, a connection closed by its owner); default 2. When
	// all are busy a woken connection gets a goroutine of its own, which
	// takes further ones until there are none for a moment, then exits.
	Workers int
}

// A Handler run is quick under slowRun; provenRuns quick runs in a row
// prove a connection's Handler (see Config.Waiters).
const provenRuns = 1

var slowRun = time.Millisecond // a variable for tests, whose runs must count as quick on a loaded machine

// watchdogTick is how often the watchdog looks for a stuck waiter while
// Handlers run (see Config.Waiters).
const watchdogTick = 20 * time.Millisecond

// maxEvents is how many ready connections a waiter takes from epoll at a
// time: those behind a Handler that blocks wait for it, so few.
const maxEvents = 16

// Poller waits for readiness of its connections.
type Poller struct {
	sys   sysPoller
	jobs  chan *Conn
	stats Stats

	mu struct {
		sync.RWMutex
		slots  []*Conn  // index -> connection; nil where free
		gens   []uint32 // index -> generation of the slot's current (or last) connection
		free   []uint32 // free slot indexes
		closed bool
	}
	minWaiters int
	waiters    atomic.Int32  // goroutines in the waiter loop (never fewer than minWaiters until Close)
	busy       atomic.Int32  // of them, running Handlers now
	waiting    atomic.Int32  // of them, waiting for epoll (or for their turn at it)
	batches    atomic.Uint64 // batches of events taken from epoll
	watchdog   struct {
		timer *time.Timer
		on    atomic.Bool   // the timer is armed (or its callback runs)
		seen  atomic.Uint64 // batches at the last tick (atomic: a re-armed tick may overlap the one ending)
	}
	wg   sync.WaitGroup
	done chan struct{}
}

// New starts a Poller.
func New(cfg Config) (*Poller, error) {
	if cfg.Waiters <= 0 {
		cfg.Waiters = 1
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	p := &Poller{jobs: make(chan *Conn), done: make(chan struct{}), minWaiters: cfg.Waiters}
	p.watchdog.timer = time.AfterFunc(time.Hour, p.tick)
	p.watchdog.timer.Stop()
	if err := p.sys.open(); err != nil {
		return nil, err
	}
	p.wg.Add(cfg.Workers + cfg.Waiters)
	for range cfg.Workers {
		go p.worker()
	}
	p.waiters.Store(int32(cfg.Waiters))
	for range cfg.Waiters {
		go p.waiter()
	}
	return p, nil
}

// Stats returns the Poller's counters.
func (p *Poller) Stats() *Stats { return &p.stats }

// Add registers c, whose descriptor must be non-blocking (every net.Conn
// of package net is); h runs whenever c has bytes to read, and once soon
// after Add if it already has.
func (p *Poller) Add(c syscall.Conn, h Handler) (*Conn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	pc := &Conn{p: p, rc: rc, h: h, unproven: provenRuns}
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	var idx uint32
	if n := len(p.mu.free); n > 0 {
		idx = p.mu.free[n-1]
		p.mu.free = p.mu.free[:n-1]
	} else {
		idx = uint32(len(p.mu.slots))
		p.mu.slots = append(p.mu.slots, nil)
		p.mu.gens = append(p.mu.gens, 0)
	}
	p.mu.gens[idx]++
	pc.token = uint64(p.mu.gens[idx])<<32 | uint64(idx)
	p.mu.slots[idx] = pc
	p.mu.Unlock()

	var serr error
	if err := rc.Control(func(fd uintptr) { serr = p.sys.add(int(fd), pc.token) }); err != nil || serr != nil {
		p.release(pc)
		return nil, errors.Join(err, serr)
	}
	p.stats.Conns.Add(1)
	// Bytes that arrived before the registration are reported by it: epoll
	// queues an event for a descriptor that is ready when added.
	return pc, nil
}

// Remove ends c's registration; Ready is not called for c after Remove
// returns, unless it is running (it may be the caller). Remove before or
// after closing c's connection, either works.
func (c *Conn) Remove() {
	p := c.p
	_ = c.rc.Control(func(fd uintptr) { p.sys.del(int(fd)) }) // fails once closed: closing removed it
	c.forget()
}

// RemoveBeforeClose is Remove for a connection its caller is about to
// close: it frees the registration but leaves the descriptor in the epoll
// set, which closing it removes (one system call less per connection).
// Events that come for it in between find the slot freed and are dropped.
func (c *Conn) RemoveBeforeClose() { c.forget() }

func (c *Conn) forget() {
	if c.p.release(c) {
		c.p.stats.Conns.Add(-1)
	}
}

// release frees c's slot; false if it was free already.
func (p *Poller) release(c *Conn) bool {
	idx := uint32(c.token)
	p.mu.Lock()
	defer p.mu.Unlock()
	if int(idx) >= len(p.mu.slots) || p.mu.slots[idx] != c {
		return false
	}
	p.mu.slots[idx] = nil
	p.mu.free = append(p.mu.free, idx)
	return true
}

// lookupLocked returns the connection of token, or nil if it is gone.
func (p *Poller) lookupLocked(token uint64) *Conn {
	idx := uint32(token)
	if int(idx) >= len(p.mu.slots) {
		return nil
	}
	c := p.mu.slots[idx]
	if c == nil || c.token != token {
		return nil
	}
	return c
}

// Read reads what the kernel holds for c, up to len(b), without blocking:
// ErrWouldBlock when it holds nothing, io.EOF once the peer has closed its
// side, another error when the connection failed or was closed.
//
// A read that fills less than b drained the socket's receive queue (a
// stream socket returns all it holds, up to len(b)), so the next Read of
// the same Handler run says ErrWouldBlock without a system call: bytes that
// arrive later raise a new edge, which runs the Handler again. Once an event
// has reported the peer's close (or an error) every Read goes to the kernel,
// so that the Handler sees EOF even when the close came with the last bytes.
func (c *Conn) Read(b []byte) (int, error) {
	if c.drained && c.state.Load()&hungUp == 0 {
		c.p.stats.Skipped.Add(1)
		return 0, ErrWouldBlock
	}
	var n int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		n, rerr = readFD(int(fd), b)
		return true // never wait: the caller goes back to epoll
	})
	c.p.stats.Reads.Add(1)
	if err != nil {
		return 0, err // closed
	}
	if rerr == nil && n < len(b) {
		c.drained = true
	}
	return n, rerr
}

// Wake runs c's Handler soon (once), even with nothing to read: for a
// timeout, or a connection closed by its owner.
func (c *Conn) Wake() { c.trigger() }

// Pause stops readiness from running c's Handler until Resume.
func (c *Conn) Pause() { c.state.Or(paused) }

// Resume ends a Pause and runs the Handler once.
func (c *Conn) Resume() {
	c.state.And(^uint32(paused))
	c.trigger()
}

// event is a readiness event from epoll: it reports whether the caller (a
// waiter) is to run the Handler now; a paused connection's event is only
// remembered (pending), as is one for a Handler already running.
func (c *Conn) event() bool {
	c.p.stats.Events.Add(1)
	if c.state.Load()&paused != 0 {
		c.state.Or(pending)
		return false
	}
	return c.claim()
}

// trigger makes the Handler run: by a worker, or after its current run.
func (c *Conn) trigger() {
	if c.claim() {
		c.p.submit(c)
	}
}

// claim makes the caller the Handler's runner (true), or marks a run
// pending after the current one (false).
func (c *Conn) claim() bool {
	for {
		s := c.state.Load()
		if s&running != 0 {
			if s&pending != 0 || c.state.CompareAndSwap(s, s|pending) {
				return false
			}
			continue
		}
		if c.state.CompareAndSwap(s, (s|running)&^pending) {
			return true
		}
	}
}

// run calls the Handler until no trigger is pending.
func (c *Conn) run() {
	for {
		c.p.stats.Runs.Add(1)
		c.drained = false
		start := time.Now()
		c.h.Ready(c)
		if time.Since(start) >= slowRun {
			c.unproven = provenRuns
		} else if c.unproven > 0 {
			c.unproven--
		}
		for {
			s := c.state.Load()
			if s&pending != 0 && s&paused == 0 {
				if c.state.CompareAndSwap(s, s&^pending) {
					break // run again
				}
				continue
			}
			if c.state.CompareAndSwap(s, s&^running) {
				return
			}
		}
	}
}

// linger is how long a goroutine started for woken connections waits for
// more before it exits.
const linger = 50 * time.Millisecond

// submit hands c to an idle worker, or to a new goroutine if none is idle.
func (p *Poller) submit(c *Conn) {
	select {
	case p.jobs <- c:
	default:
		p.stats.Spawned.Add(1)
		go p.burst(c)
	}
}

// burst runs c, then woken connections as they come, until none has come
// for linger (or the Poller closes).
func (p *Poller) burst(c *Conn) {
	var t *time.Timer
	for {
		c.run()
		select {
		case c = <-p.jobs:
			continue
		default:
		}
		if t == nil {
			t = time.NewTimer(linger)
		} else {
			t.Reset(linger)
		}
		select {
		case c = <-p.jobs:
		case <-t.C:
			return
		case <-p.done:
			t.Stop()
			return
		}
	}
}

func (p *Poller) worker() {
	defer p.wg.Done()
	for {
		select {
		case c := <-p.jobs:
			c.run()
		case <-p.done:
			return
		}
	}
}

// waiter takes readiness events from epoll and runs the Handlers itself,
// until Close (see Config.Waiters).
func (p *Poller) waiter() {
	defer p.wg.Done()
	var buf waitBuf
	evs := make([]event, 0, maxEvents)
	conns := make([]*Conn, 0, maxEvents)
	for {
		var closed bool
		p.waiting.Add(1)
		evs, closed = p.sys.wait(&buf, evs[:0])
		p.waiting.Add(-1)
		if closed {
			p.waiters.Add(-1)
			return
		}
		conns = conns[:0]
		p.mu.RLock()
		for _, e := range evs {
			if c := p.lookupLocked(e.token); c != nil {
				if e.hangup {
					c.state.Or(hungUp) // before the run the event makes: it reads on to EOF
				}
				conns = append(conns, c)
			}
		}
		p.mu.RUnlock()
		p.batches.Add(1)
		p.busy.Add(1)
		spare, watched := false, false
		for i, c := range conns {
			if c.event() {
				switch {
				case spare:
				case c.unproven > 0:
					p.spare()
					spare = true
				case !watched:
					p.watch()
					watched = true
				}
				c.run()
			}
			conns[i] = nil
		}
		p.busy.Add(-1)
		if p.retire() {
			return
		}
	}
}

// spare makes sure a waiter waits while the caller, a waiter, runs a
// Handler that may block: it starts one if every waiter is busy.
func (p *Poller) spare() {
	if p.busy.Load() >= p.waiters.Load() {
		p.startWaiter(&p.stats.Spawned) // the caller is counted in wg: Close is not waiting yet
	}
}

// startWaiter starts one more waiter and counts it in n.
func (p *Poller) startWaiter(n *atomic.Uint64) {
	p.waiters.Add(1)
	p.wg.Add(1)
	n.Add(1)
	go p.waiter()
}

// watch arms the watchdog, unless it is armed, for a proven Handler about
// to run with no spare waiter.
func (p *Poller) watch() {
	if p.watchdog.on.CompareAndSwap(false, true) {
		p.watchdog.timer.Reset(watchdogTick)
	}
}

// tick is the watchdog: a waiter has been running Handlers since the last
// tick, no batch has been taken since, and none waits: one more waiter. It
// stays armed while waiters take batches or run Handlers.
func (p *Poller) tick() {
	w := &p.watchdog
	b := p.batches.Load()
	seen := w.seen.Swap(b)
	stuck := b == seen && p.busy.Load() > 0 && p.waiting.Load() == 0
	active := b != seen || p.busy.Load() > 0
	if stuck {
		p.mu.RLock() // Close waits for it: no waiter starts once Close has begun
		if !p.mu.closed {
			p.startWaiter(&p.stats.Rescues)
		}
		p.mu.RUnlock()
	}
	if active && !p.isClosed() {
		w.timer.Reset(watchdogTick)
		return
	}
	w.on.Store(false)
	if p.batches.Load() != b && !p.isClosed() && w.on.CompareAndSwap(false, true) {
		w.timer.Reset(watchdogTick) // a batch began as this tick was ending
	}
}

func (p *Poller) isClosed() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.mu.closed
}

// retire reports (and counts) a waiter leaving: one more than the minimum,
// now that at least one other waiter is free.
func (p *Poller) retire() bool {
	for {
		w := p.waiters.Load()
		if int(w) <= p.minWaiters || p.busy.Load() >= w-1 {
			return false
		}
		if p.waiters.CompareAndSwap(w, w-1) {
			return true
		}
	}
}

// Close stops the Poller's goroutines; registered connections stay open.
func (p *Poller) Close() error {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil
	}
	p.mu.closed = true
	p.mu.Unlock()
	p.watchdog.timer.Stop()
	p.sys.wake() // the eventfd stays readable: every waiter sees it and exits
	close(p.done)
	p.wg.Wait()
	return p.sys.close()
}
