package connq

import "sync"

// Rounds: the goroutine that reads a publisher's connection feeds mochi a
// read's worth of packets at a time, and each publish among them queues a
// frame on every subscriber's connection. Started at the first frame, a
// subscriber's writer would race the rest of the read and send one or two
// frames per writev; a round holds the writers of the connections it
// touches (a Cork each) until the read has been fed, then starts them, so
// that each subscriber's frames of the read leave together: in the profile
// of one publisher and 100 QoS 1 subscribers (loadgen fanout -subs 100
// -qos 1), 17 frames per writev became 50 and the broker's CPU per
// delivery fell by a fifth.
//
// The writers start as goroutines (not on the reader's goroutine, as a
// Flusher does): a hundred writevs made one after the other by the reader
// left a core idle and cost a fifth of the QoS 0 fan-out's rate.
//
// A round lets its frames go once it has held RoundBudget of them, so
// that a long read (32 KiB of small publishes) does not hold the first
// frames back until its last publish is queued.

// RoundBudget is how many frames a round holds before it lets them go: at
// about a microsecond per delivery, a held frame waits at most some 15 ms
// (a 32 KiB read of small publishes to 100 subscribers). 4,096 cost the
// QoS 1 case above a third of its frames per writev, 16,384 nothing.
const RoundBudget = 16384

// A Round holds back writers (see above). Its methods are safe for
// concurrent use: another goroutine acting for the reading client (its
// will, sent by whoever ends it) may hold a connection into the round; one
// that comes after the round ended holds nothing.
type Round struct {
	mu    sync.Mutex
	on    bool
	gen   uint32 // counts releases: a connection held in an earlier one is held again
	held  int    // frames held since the last release
	conns []*Conn
}

var rounds = sync.Pool{New: func() any { return new(Round) }}

// BeginRound starts a round for the goroutine that reads c; Round returns
// it to whoever queues frames on c's reader's behalf until EndRound.
func (c *Conn) BeginRound() *Round {
	r := rounds.Get().(*Round)
	r.mu.Lock()
	r.on = true
	r.mu.Unlock()
	c.round.Store(r)
	return r
}

// EndRound ends r, which BeginRound returned, and starts the writers it held.
func (c *Conn) EndRound(r *Round) {
	c.round.CompareAndSwap(r, nil)
	r.mu.Lock()
	r.on = false
	r.releaseLocked()
	r.mu.Unlock()
	rounds.Put(r)
}

// Round returns the round in progress on c's reader, nil if none.
func (c *Conn) Round() *Round { return c.round.Load() }

// Hold holds c's writer until the round ends (or lets its frames go); call
// it before queuing a frame on c. A nil round holds nothing.
func (r *Round) Hold(c *Conn) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return
	}
	if r.held++; r.held > RoundBudget {
		r.releaseLocked()
		r.held = 1
	}
	c.mu.Lock()
	if c.mu.round != r || c.mu.roundGen != r.gen {
		// Not held by this release of r yet. (Two rounds holding c
		// take turns in these fields; then a round may cork c twice,
		// and releases it as often.)
		c.mu.round, c.mu.roundGen = r, r.gen
		c.mu.corked++
		r.conns = append(r.conns, c)
	}
	c.mu.Unlock()
}

// releaseLocked undoes the round's corks, starting the writers of the
// connections that have frames queued.
func (r *Round) releaseLocked() {
	for i, c := range r.conns {
		c.mu.Lock()
		if c.mu.round == r {
			c.mu.round = nil
		}
		if c.mu.corked > 0 {
			c.mu.corked--
		}
		if c.mu.corked == 0 && c.mu.head < len(c.mu.q) {
			c.scheduleLocked()
		}
		c.mu.Unlock()
		r.conns[i] = nil
	}
	r.conns = r.conns[:0]
	r.gen++
	r.held = 0
}
