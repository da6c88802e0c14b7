package main

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// The connections and sessions scenarios: what idle clients cost a broker.

// ---------------------------------------------------------------- connections

type connJSON struct {
	Requested     int     `json:"requested"`
	Opened        int     `json:"opened"`
	Failed        int     `json:"failed"`
	FirstError    string  `json:"first_error,omitempty"`
	ConnectS      float64 `json:"connect_s"`
	ConnectPerS   float64 `json:"connect_per_s"`
	Alive         int     `json:"alive"`
	RSSBeforeKB   int64   `json:"rss_before_kb"`
	RSSAfterKB    int64   `json:"rss_after_kb"`
	RSSPerConnKB  float64 `json:"rss_per_conn_kb"`
	FDLimit       int     `json:"fd_limit"`
	BrokerFDLimit int     `json:"broker_fd_limit,omitempty"`
	Subscribed    bool    `json:"subscribed"`
	Transport     string  `json:"transport,omitempty"`
	// BrokerUsPerConn is the broker's CPU time per connection opened (and
	// subscribed), over the connect phase.
	BrokerUsPerConn float64 `json:"broker_us_per_conn,omitempty"`
	// Go is what each connection costs a Go broker (-broker-pprof): heap,
	// goroutine stacks, goroutines.
	Go *perUnit `json:"go,omitempty"`
}

// failures counts the clients of a scenario that failed, keeping the first error.
type failures struct {
	n     atomic.Int64
	first atomic.Value // string
}

// add counts err; it returns nil, so that parallel goes on with the others.
func (f *failures) add(err error) error {
	f.n.Add(1)
	f.first.CompareAndSwap(nil, err.Error())
	return nil
}

// count returns how many failed and the first error ("" if none).
func (f *failures) count() (int, string) {
	s, _ := f.first.Load().(string)
	return int(f.n.Load()), s
}

// err describes the failures, or returns nil if there were none.
func (f *failures) err() error {
	n, first := f.count()
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d connections failed: %s", n, first)
}

func runConnections(ctx context.Context, cfg config, res *result) {
	started := time.Now()
	cj := &connJSON{Requested: cfg.conns, FDLimit: raiseFDLimit(), BrokerFDLimit: procFDLimit(cfg.brokerPID)}
	res.Connections = cj
	n := cfg.conns
	if lim := cj.FDLimit - 64; n > lim {
		n = lim
	}
	if cj.BrokerFDLimit > 0 && n > cj.BrokerFDLimit-64 {
		n = cj.BrokerFDLimit - 64
	}
	if n < cfg.conns {
		res.Notes = append(res.Notes, fmt.Sprintf("file descriptor limits allow %d of the %d connections asked for", n, cfg.conns))
	}
	r := newRun(cfg)
	cj.Subscribed, cj.Transport = cfg.subscribe, cfg.transport
	cj.RSSBeforeKB = rssKB(cfg.brokerPID)
	goBefore, err := readGoRuntime(cfg.brokerPprof)
	if err != nil {
		res.Errors = append(res.Errors, "broker pprof: "+err.Error())
	}
	c0 := snapCPU(cfg.brokerPIDs)
	conns, failed := openIdle(ctx, cfg, r, n)
	if err := failed.err(); err != nil {
		res.Errors = append(res.Errors, err.Error())
	}
	c1 := snapCPU(cfg.brokerPIDs)
	el := c1.wall.Sub(c0.wall).Seconds()
	cj.Failed, cj.FirstError = failed.count()
	cj.Opened = n - cj.Failed
	cj.ConnectS = round3(el)
	if el > 0 {
		cj.ConnectPerS = round3(float64(cj.Opened) / el)
	}
	res.CPU = cpuBetween(c0, c1, runtime.NumCPU(), 0)
	if cj.Opened > 0 && cfg.brokerPID > 0 {
		cj.BrokerUsPerConn = round3((c1.broker - c0.broker).Seconds() * 1e6 / float64(cj.Opened))
	}

	// Let the broker settle, then read RSS: the stable value after the burst.
	time.Sleep(cfg.settle)
	cj.RSSAfterKB = rssKB(cfg.brokerPID)
	if cj.Opened > 0 && cj.RSSAfterKB > 0 {
		cj.RSSPerConnKB = round3(float64(cj.RSSAfterKB-cj.RSSBeforeKB) / float64(cj.Opened))
	}
	if goBefore != nil { // after RSS: reading the heap forces a GC
		goAfter, err := readGoRuntime(cfg.brokerPprof)
		if err != nil {
			res.Errors = append(res.Errors, "broker pprof: "+err.Error())
		}
		cj.Go = newPerUnit(goBefore, goAfter, cj.Opened)
	}

	// Prove the connections are served: PINGREQ on each, count PINGRESPs.
	var alive atomic.Int64
	_ = parallel(ctx, cfg.conc, n, func(i int) error {
		m := conns[i]
		if m == nil {
			return nil
		}
		m.c.SetDeadline(time.Now().Add(cfg.timeout))
		if _, err := m.c.Write(mqttwire.AppendPingreq(nil)); err != nil {
			return nil
		}
		if p, err := m.fr.Next(); err == nil && p.Type == mqttwire.TypePingresp {
			alive.Add(1)
		}
		return nil
	})
	cj.Alive = int(alive.Load())
	for _, m := range conns {
		if m != nil {
			m.abort()
		}
	}
	if cj.Opened == 0 {
		res.Errors = append(res.Errors, "no connection opened")
	} else if cj.Alive < cj.Opened {
		res.Errors = append(res.Errors, fmt.Sprintf("%d of %d connections did not answer PINGREQ", cj.Opened-cj.Alive, cj.Opened))
	}
	res.ElapsedS = round3(time.Since(started).Seconds())
}

// openIdle opens n idle connections (cfg.conc at a time): CONNECT with
// cfg.keepalive and, with cfg.subscribe, one QoS 1 subscription to a topic
// of the connection's own. Failed ones are nil in the slice.
func openIdle(ctx context.Context, cfg config, r *run, n int) ([]*mconn, *failures) {
	conns := make([]*mconn, n)
	failed := new(failures)
	o := dialOpts{proto: cfg.proto, timeout: cfg.timeout, readBuf: 256, keepalive: cfg.keepalive, transport: cfg.transport}
	_ = parallel(ctx, cfg.conc, n, func(i int) error {
		m, err := dialMQTT(ctx, cfg.addrs[i%len(cfg.addrs)], r.clientID("c", i), o)
		if err != nil {
			return failed.add(err)
		}
		if cfg.subscribe {
			if err := m.subscribe(fmt.Sprintf("lg%08x/cmd/%d", r.runID, i), 1, cfg.timeout); err != nil {
				m.abort()
				return failed.add(err)
			}
		}
		conns[i] = m
		return nil
	})
	return conns, failed
}

type sessionsJSON struct {
	Requested   int     `json:"requested"`
	Stored      int     `json:"stored"` // sessions created, subscribed and left
	Failed      int     `json:"failed"`
	FirstError  string  `json:"first_error,omitempty"`
	CreateS     float64 `json:"create_s"`
	Checked     int     `json:"checked"` // sessions reconnected afterwards to see them kept
	Present     int     `json:"present"` // of those, how many the broker still had
	RSSBeforeKB int64   `json:"rss_before_kb"`
	RSSAfterKB  int64   `json:"rss_after_kb"`
	// RSSPerSessionKB is what one disconnected persistent session with one
	// subscription costs the broker.
	RSSPerSessionKB float64  `json:"rss_per_session_kb"`
	Go              *perUnit `json:"go,omitempty"`
}

// runSessions creates cfg.conns persistent sessions (3.1.1 clean session 0,
// or MQTT 5 with an hour's session expiry), each with one QoS 1
// subscription, and leaves them (DISCONNECT); after cfg.settle it reads the
// broker's RSS, then reconnects a sample to check that they were kept.
func runSessions(ctx context.Context, cfg config, res *result) {
	started := time.Now()
	sj := &sessionsJSON{Requested: cfg.conns}
	res.Sessions = sj
	raiseFDLimit()
	r := newRun(cfg)
	o := dialOpts{proto: cfg.proto, timeout: cfg.timeout, readBuf: 256, keepalive: cfg.keepalive, persistent: true}
	sj.RSSBeforeKB = rssKB(cfg.brokerPID)
	goBefore, err := readGoRuntime(cfg.brokerPprof)
	if err != nil {
		res.Errors = append(res.Errors, "broker pprof: "+err.Error())
	}
	c0 := snapCPU(cfg.brokerPIDs)
	var failed failures
	_ = parallel(ctx, cfg.conc, cfg.conns, func(i int) error {
		m, err := dialMQTT(ctx, cfg.addrs[i%len(cfg.addrs)], r.clientID("s", i), o)
		if err != nil {
			return failed.add(err)
		}
		defer m.close()
		if err := m.subscribe(fmt.Sprintf("lg%08x/sess/%d", r.runID, i), 1, cfg.timeout); err != nil {
			return failed.add(err)
		}
		return nil
	})
	c1 := snapCPU(cfg.brokerPIDs)
	sj.CreateS = round3(c1.wall.Sub(c0.wall).Seconds())
	sj.Failed, sj.FirstError = failed.count()
	sj.Stored = cfg.conns - sj.Failed
	res.CPU = cpuBetween(c0, c1, runtime.NumCPU(), 0)
	time.Sleep(cfg.settle) // let the broker settle before reading its RSS
	sj.RSSAfterKB = rssKB(cfg.brokerPID)
	if sj.Stored > 0 && sj.RSSAfterKB > 0 {
		sj.RSSPerSessionKB = round3(float64(sj.RSSAfterKB-sj.RSSBeforeKB) / float64(sj.Stored))
	}
	if goBefore != nil {
		goAfter, err := readGoRuntime(cfg.brokerPprof)
		if err != nil {
			res.Errors = append(res.Errors, "broker pprof: "+err.Error())
		}
		sj.Go = newPerUnit(goBefore, goAfter, sj.Stored)
	}
	// Were they kept? Reconnect every hundredth (which resumes it: done last).
	for i := 0; i < cfg.conns; i += 100 {
		m, err := dialMQTT(ctx, cfg.addrs[i%len(cfg.addrs)], r.clientID("s", i), o)
		if err != nil {
			continue
		}
		sj.Checked++
		if m.present {
			sj.Present++
		}
		m.close()
	}
	if sj.Stored == 0 {
		res.Errors = append(res.Errors, "no session created")
	} else if sj.Present < sj.Checked {
		res.Errors = append(res.Errors, fmt.Sprintf("%d of %d sessions checked were not kept", sj.Checked-sj.Present, sj.Checked))
	}
	if sj.Failed > 0 {
		res.Errors = append(res.Errors, fmt.Sprintf("%d sessions failed: %s", sj.Failed, sj.FirstError))
	}
	res.ElapsedS = round3(time.Since(started).Seconds())
}
