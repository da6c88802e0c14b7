package main

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The conflate scenario: one publisher cycles over many topics at a fixed
// rate; one reader subscribed to all of them reads at a fixed byte rate,
// far below what is published, with a small socket buffer so the backlog
// sits in the broker. A broker that conflates by topic keeps one message per
// topic for it, so every value it gets is fresh and the last value of every
// topic arrives soon after publishing stops; one that queues everything
// delivers an ever older backlog.

// conflateJSON is the conflate scenario's result.
type conflateJSON struct {
	Topics   int `json:"topics"`
	ReadRate int `json:"read_rate_bytes_per_s"`
	// TopicsReceived is how many topics the reader got at least one value of.
	TopicsReceived int `json:"topics_received"`
	// FinalValues is how many topics' last published value reached the
	// reader by the end of the drain; FinalDelayMS how long after the
	// publisher stopped the last of them arrived (-1: not all did).
	FinalValues  int     `json:"final_values"`
	FinalDelayMS float64 `json:"final_delay_ms"`
}

// finalTracker follows, per stream, the newest sequence a reader got, so
// that the drain can tell when every stream's last value arrived.
type finalTracker struct {
	mu    sync.Mutex
	seen  []uint32 // per stream: highest key sequence received
	final []uint32 // per stream: last key sequence published (set when publishing stops)
	done  atomic.Int64
}

func newFinalTracker(streams int) *finalTracker {
	return &finalTracker{seen: make([]uint32, streams)}
}

func (f *finalTracker) observe(stream, seq uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if int(stream) >= len(f.seen) || seq <= f.seen[stream] {
		return
	}
	f.seen[stream] = seq
	if f.final != nil && seq >= f.final[stream] {
		f.done.Add(1)
	}
}

// setFinal records the last sequence published per stream.
func (f *finalTracker) setFinal(final []uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.final = final
	n := int64(0)
	for i, s := range f.seen {
		if s >= final[i] {
			n++
		}
	}
	f.done.Store(n)
}

func (f *finalTracker) received() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.seen {
		if s > 0 {
			n++
		}
	}
	return n
}

func setupConflate(r *run) error {
	cfg := r.cfg
	t := max(cfg.topics, 1)
	s := r.addSubscriber("bench/conf/+", false, -1)
	s.readRate = cfg.readRate
	specs := make([]streamSpec, t)
	for k := range specs {
		specs[k] = streamSpec{topic: "bench/conf/" + strconv.Itoa(k), stream: uint32(k), fan: 1}
	}
	r.addPublisher(specs)
	r.finals = newFinalTracker(t)
	r.gate = gateNone // the reader is slow on purpose: the publisher keeps its rate
	return nil
}

// conflateResult fills the scenario's figures once the run has ended.
func (r *run) conflateResult(res *result, stopped time.Time, lastFinal time.Time) {
	c := &conflateJSON{Topics: max(r.cfg.topics, 1), ReadRate: r.cfg.readRate, TopicsReceived: r.finals.received(),
		FinalValues: int(r.finals.done.Load()), FinalDelayMS: -1}
	if c.FinalValues == c.Topics {
		c.FinalDelayMS = round3(float64(lastFinal.Sub(stopped).Microseconds()) / 1000)
	}
	res.Conflate = c
}

// publishedFinals returns the last key sequence the (one) publisher sent per stream.
func (r *run) publishedFinals() []uint32 {
	final := make([]uint32, r.streams)
	for _, p := range r.pubs {
		for ti, t := range p.tmpls {
			final[t.stream] = max(final[t.stream], p.tseq[ti])
		}
	}
	return final
}

// rateConn reads at most rate bytes per second.
type rateConn struct {
	net.Conn
	rate  float64
	start time.Time
	read  int64
}

func (c *rateConn) Read(p []byte) (int, error) {
	if c.start.IsZero() {
		c.start = time.Now()
	}
	allowed := int64(c.rate*time.Since(c.start).Seconds()) - c.read
	if want := int64(min(len(p), 4096)); allowed < want {
		time.Sleep(time.Duration(float64(want-allowed) / c.rate * float64(time.Second)))
		allowed = want
	}
	n, err := c.Conn.Read(p[:min(int64(len(p)), allowed)])
	c.read += int64(n)
	return n, err
}
