package ops

import (
	"errors"
	"sync"
	"time"

	"github.com/keyline-mq/keyline/persistence"
)

// observer watches the broker for operators: it samples the figures once a
// second (sampler) and shows live messages to topic streams (topicWatch; a
// mochi hook in package hooks hands it the publishes). Its goroutine starts
// with Service.Start; Service.Stop ends it and every open topic stream.
type observer struct {
	s       *Service
	samples sampler
	topics  *topicWatch
	// groupRates, when set (before start), records every group's counters
	// for the admin API's rates every groupRatesEvery.
	groupRates func(now time.Time)

	done chan struct{}
	wg   sync.WaitGroup
}

func newObserver(s *Service) *observer {
	return &observer{s: s, topics: newTopicWatch(), done: make(chan struct{})}
}

// start starts sampling.
func (o *observer) start() {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		o.run()
	}()
}

// stop ends sampling and every topic stream, and waits for them.
func (o *observer) stop() {
	close(o.done)
	o.topics.close()
	o.wg.Wait()
}

// groupRatesEvery is how often every group's rates are sampled: often enough
// that a page shows rates at the first look, rarely enough to cost nothing.
const groupRatesEvery = 5 * sampleEvery

func (o *observer) run() {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	o.sample(time.Now())
	for i := 1; ; i++ {
		select {
		case <-o.done:
			return
		case now := <-t.C:
			o.sample(now)
			if o.groupRates != nil && i%int(groupRatesEvery/sampleEvery) == 0 {
				o.groupRates(now)
			}
		}
	}
}

// sample records the broker's counters and those of the watched groups.
func (o *observer) sample(now time.Time) {
	f := o.s.b.Figures()
	o.samples.addTotals(totals{
		at:      now,
		in:      uint64(f.MessagesReceived),
		out:     uint64(f.MessagesSent),
		dropped: uint64(f.MessagesDropped + f.InflightDropped),
		bin:     uint64(f.BytesReceived),
		bout:    uint64(f.BytesSent),
		clients: f.ClientsConnected,
	})
	for _, name := range o.samples.watched(now) {
		st, err := o.s.groups.groups.Group(name)
		if errors.Is(err, persistence.ErrGroupNotFound) {
			o.samples.forget(name)
			continue
		}
		if err != nil {
			continue // closing: the next tick, if any, tries again
		}
		s := st.Stats
		gt := groupTotals{at: now, head: max(st.Info.Head, s.Head), backlog: st.Info.Backlog}
		if st.Running {
			gt.delivered, gt.acked, gt.dead = s.Delivered, s.Acked, s.DeadLettered
			gt.inFlight = s.InFlight
			if c := max(s.Cursor, st.Info.Cursor); gt.head > c {
				gt.backlog = gt.head - c
			} else {
				gt.backlog = 0
			}
		}
		o.samples.addGroup(name, gt)
	}
}
