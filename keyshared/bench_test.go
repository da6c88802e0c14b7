package keyshared

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// genLog is an in-memory Log whose messages are generated from their offset
// (key = keys[offset % len(keys)]), so a benchmark of any length needs no
// memory for them. Head is moved by the benchmark.
type genLog struct {
	keys    []string
	payload []byte
	head    atomic.Uint64
	cursor  atomic.Uint64
}

func newGenLog(nkeys int) *genLog {
	l := &genLog{payload: make([]byte, 64)}
	for i := range nkeys {
		l.keys = append(l.keys, fmt.Sprintf("device/%d", i))
	}
	return l
}

func (l *genLog) ReadFrom(from uint64, max int, buf []Message) ([]Message, error) {
	head := l.head.Load()
	for o := from; o <= head && max > 0; o++ {
		buf = append(buf, Message{Offset: o, Key: l.keys[o%uint64(len(l.keys))], Topic: "t", Payload: l.payload, QoS: 1})
		max--
	}
	return buf, nil
}

func (l *genLog) Head() uint64                  { return l.head.Load() }
func (l *genLog) LoadCursor() (uint64, error)   { return l.cursor.Load(), nil }
func (l *genLog) Resolve([]uint64)              {}
func (l *genLog) DeadLetter(d DeadLetter) error { return nil }

// pendingDeliverer collects deliveries for the benchmark to ack.
type pendingDeliverer struct {
	pending, spare []delivery
}

func (p *pendingDeliverer) Deliver(member string, m *Message, attempt int) bool {
	p.pending = append(p.pending, delivery{member: member, offset: m.Offset})
	return true
}

func (p *pendingDeliverer) Revoke(string, uint64) {}

func (p *pendingDeliverer) take() []delivery {
	got := p.pending
	p.pending = p.spare[:0]
	p.spare = got
	return got
}

// BenchmarkWindowRoundTrip measures the dispatch state alone: read from the
// log, route, deliver, ack, advance the cursor; one op is one message.
// "keys=10000" spreads 10,000 keys over a 10,000-message window; "full-window"
// keeps the window full with 100 keys, so almost every message waits behind
// its key's in-flight one.
func BenchmarkWindowRoundTrip(b *testing.B) {
	for _, bc := range []struct {
		name               string
		keys, window, limt int
	}{
		{"keys=10000", 10000, 10000, 10000},
		{"full-window/keys=100", 100, 10000, 1000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			log := newGenLog(bc.keys)
			out := &pendingDeliverer{}
			cfg := DefaultConfig()
			cfg.Window, cfg.MemberMaxInflight = bc.window, bc.limt
			c := newCore(cfg, log, out)
			if err := c.open(); err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			for i := range 8 {
				if err := c.addMember(fmt.Sprint("worker-", i), memberSpec{}, now); err != nil {
					b.Fatal(err)
				}
			}
			// Warm up: fill the window and reach the steady state.
			log.head.Store(uint64(2 * bc.window))
			c.poll(now)
			for c.cursor() < uint64(bc.window) {
				for _, d := range out.take() {
					c.ack(d.member, d.offset, now)
				}
				c.poll(now)
			}
			start := c.st.acked
			log.head.Store(1 << 62)
			b.ReportAllocs()
			b.ResetTimer()
			for c.st.acked-start < uint64(b.N) {
				for _, d := range out.take() {
					c.ack(d.member, d.offset, now)
				}
				c.poll(now)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(c.w.count), "window")
			if err := c.checkInvariants(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// benchAcker acks each delivery at once, from inside Deliver.
type benchAcker struct {
	d      *Dispatcher
	n      atomic.Int64
	target int64
	done   chan struct{}
}

func (a *benchAcker) Deliver(member string, m *Message, attempt int) bool {
	if a.d.Ack(member, m.Offset) != nil {
		return false
	}
	if a.n.Add(1) == a.target {
		close(a.done)
	}
	return true
}

func (a *benchAcker) Revoke(string, uint64) {}

// BenchmarkLoop measures the whole Dispatcher: its goroutine, the batched
// ack queue, Notify, the published stats and debounced cursor saves, with an
// in-memory log and 8 members that ack instantly. "preloaded" starts with
// b.N messages in the log; "live-publisher" has a publisher goroutine append
// them 64 at a time, calling Notify after each append.
func BenchmarkLoop(b *testing.B) {
	for _, live := range []bool{false, true} {
		name := "preloaded"
		if live {
			name = "live-publisher"
		}
		b.Run(name, func(b *testing.B) {
			log := newGenLog(10000)
			out := &benchAcker{target: int64(b.N), done: make(chan struct{})}
			d, err := New(DefaultConfig(), log, out)
			if err != nil {
				b.Fatal(err)
			}
			out.d = d
			for i := range 8 {
				if err := d.AddMember(fmt.Sprint("worker-", i), MemberOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			pubDone := make(chan struct{})
			if live {
				go func() {
					defer close(pubDone)
					for h := uint64(0); h < uint64(b.N); {
						h = min(h+64, uint64(b.N))
						log.head.Store(h)
						d.Notify()
					}
				}()
			} else {
				close(pubDone)
				log.head.Store(uint64(b.N))
				d.Notify()
			}
			<-out.done
			<-pubDone
			if err := d.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			if err := d.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
			if s := d.Stats(); s.Acked != uint64(b.N) || log.cursor.Load() != uint64(b.N) {
				b.Fatalf("acked %d, cursor %d, want %d", s.Acked, log.cursor.Load(), b.N)
			}
		})
	}
}
