package broker

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/keyshared"
)

// observer is a mochi hook that watches the broker for operators: it samples
// the counters once a second (sampler) and shows live messages to topic
// streams (topicWatch). Its goroutine starts with the server (OnStarted) and
// Stop, which mochi calls when the server closes, ends it and every open
// topic stream.
type observer struct {
	mqtt.HookBase
	b       *Broker
	samples sampler
	topics  *topicWatch
	// groupRates, when set (before the server starts), records every group's
	// counters for the admin API's rates every groupRatesEvery.
	groupRates func(now time.Time)

	stop     chan struct{}
	stopOnce sync.Once
	started  atomic.Bool
	wg       sync.WaitGroup
}

func newObserver(b *Broker) *observer {
	return &observer{b: b, topics: newTopicWatch(), stop: make(chan struct{})}
}

// ID names the hook.
func (o *observer) ID() string { return "keyline-observer" }

// Provides reports which hook methods the observer implements. mochi asks
// before every call, so OnPublished is provided only while a topic stream is
// open: without one a publish costs an atomic load, not a call.
func (o *observer) Provides(b byte) bool {
	return b == mqtt.OnStarted || (b == mqtt.OnPublished && o.topics.watching())
}

// OnStarted starts sampling.
func (o *observer) OnStarted() {
	if o.started.Swap(true) {
		return
	}
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		o.run()
	}()
}

// OnPublished shows a publish to the topic streams whose filter matches.
func (o *observer) OnPublished(_ *mqtt.Client, pk packets.Packet) {
	o.topics.publish(&pk, time.Now())
}

// Stop ends sampling and every topic stream, and waits for them.
func (o *observer) Stop() error {
	o.stopOnce.Do(func() { close(o.stop) })
	o.topics.close()
	o.wg.Wait()
	return nil
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
		case <-o.stop:
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
	i := o.b.server.Info
	o.samples.addTotals(totals{
		at:      now,
		in:      uint64(atomic.LoadInt64(&i.MessagesReceived)),
		out:     uint64(atomic.LoadInt64(&i.MessagesSent)),
		dropped: uint64(atomic.LoadInt64(&i.MessagesDropped) + atomic.LoadInt64(&i.InflightDropped)),
		bin:     uint64(atomic.LoadInt64(&i.BytesReceived)),
		bout:    uint64(atomic.LoadInt64(&i.BytesSent)),
		clients: atomic.LoadInt64(&i.ClientsConnected),
	})
	for _, name := range o.samples.watched(now) {
		st, err := o.b.keyShared.Group(name)
		if errors.Is(err, keyshared.ErrGroupNotFound) {
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
