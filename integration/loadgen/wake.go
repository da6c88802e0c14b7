package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// The wake scenario: many idle devices, each sending one QoS 1 telemetry
// message per period, their sends spread evenly over the period (device i
// at i/n of it). What it measures is the broker's CPU for waking up a
// connection that has been idle for a long time, reading one publish and
// acknowledging it, against the same load on another broker.

type wakeJSON struct {
	Requested  int     `json:"requested"`
	Opened     int     `json:"opened"`
	Failed     int     `json:"failed"`
	FirstError string  `json:"first_error,omitempty"`
	ConnectS   float64 `json:"connect_s"`
	PeriodS    float64 `json:"period_s"`
	WindowS    float64 `json:"window_s"`
	Published  uint64  `json:"published"`
	Acked      uint64  `json:"acked"`
	Lost       uint64  `json:"lost"` // publishes without a PUBACK within -timeout
	// BrokerCPUS is the broker's CPU time over the window; BrokerUsPerMsg
	// that per acknowledged message.
	BrokerCPUS     float64     `json:"broker_cpu_s"`
	BrokerUsPerMsg float64     `json:"broker_us_per_msg"`
	AckLatency     latencyJSON `json:"ack_latency_us"`
	RSSAfterKB     int64       `json:"rss_after_kb"`
}

func runWake(ctx context.Context, cfg config, res *result) {
	started := time.Now()
	wj := &wakeJSON{Requested: cfg.conns, PeriodS: cfg.period.Seconds(), WindowS: cfg.duration.Seconds()}
	res.Wake = wj
	n := cfg.conns
	if lim := raiseFDLimit() - 64; n > lim {
		n = lim
	}
	if bl := procFDLimit(cfg.brokerPID); bl > 0 && n > bl-64 {
		n = bl - 64
	}
	r := newRun(cfg)
	conns, failed := openIdle(ctx, cfg, r, n)
	wj.ConnectS = round3(time.Since(started).Seconds())
	wj.Failed, wj.FirstError = failed.count()
	wj.Opened = n - wj.Failed
	if wj.Opened == 0 {
		res.Errors = append(res.Errors, "no connection opened: "+wj.FirstError)
		return
	}
	frames := make([][]byte, n)
	for i, m := range conns {
		if m == nil {
			continue
		}
		p := &mqttwire.Publish{Topic: fmt.Sprintf("lg%08x/tele/%d", r.runID, i), QoS: 1, PacketID: 1, Payload: make([]byte, cfg.payload)}
		frames[i] = mqttwire.AppendPublish(nil, cfg.proto, p)
	}

	var (
		published, acked, lost atomic.Uint64
		mu                     sync.Mutex
		lat                    hist
		readers                sync.WaitGroup
	)
	c0 := snapCPU(cfg.brokerPIDs)
	t0 := c0.wall
	step := cfg.period / time.Duration(n)
	end := t0.Add(cfg.duration)
	timer := time.NewTimer(0)
	<-timer.C
loop:
	for k := 0; ; k++ {
		for i, m := range conns {
			due := t0.Add(time.Duration(k)*cfg.period + time.Duration(i)*step)
			if !due.Before(end) {
				break loop
			}
			if m == nil {
				continue
			}
			if d := time.Until(due); d > 0 {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-ctx.Done():
					break loop
				}
			}
			sent := time.Now()
			_ = m.c.SetDeadline(sent.Add(cfg.timeout))
			if _, err := m.c.Write(frames[i]); err != nil {
				lost.Add(1)
				continue
			}
			published.Add(1)
			readers.Add(1)
			go func() {
				defer readers.Done()
				p, err := m.fr.Next()
				if err != nil || p.Type != mqttwire.TypePuback {
					lost.Add(1)
					return
				}
				d := time.Since(sent)
				acked.Add(1)
				mu.Lock()
				lat.record(d.Nanoseconds())
				mu.Unlock()
			}()
		}
	}
	readers.Wait()
	c1 := snapCPU(cfg.brokerPIDs)
	wj.RSSAfterKB = rssKB(cfg.brokerPID)
	wj.Published, wj.Acked, wj.Lost = published.Load(), acked.Load(), lost.Load()
	wj.AckLatency = lat.summary()
	res.CPU = cpuBetween(c0, c1, runtime.NumCPU(), wj.Acked)
	wj.BrokerCPUS = round3((c1.broker - c0.broker).Seconds())
	if wj.Acked > 0 {
		wj.BrokerUsPerMsg = round3((c1.broker - c0.broker).Seconds() * 1e6 / float64(wj.Acked))
	}
	res.Published, res.PublishedAll = wj.Published, wj.Published
	for _, m := range conns {
		if m != nil {
			m.abort()
		}
	}
	if wj.Lost > 0 {
		res.Errors = append(res.Errors, fmt.Sprintf("%d of %d publishes got no PUBACK", wj.Lost, wj.Published))
	}
	if err := failed.err(); err != nil {
		res.Errors = append(res.Errors, err.Error())
	}
	res.ElapsedS = round3(time.Since(started).Seconds())
}
