package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// How a publisher is held back so that it measures sustained throughput
// instead of filling the broker's queues.
const (
	gateNone  = iota
	gateMin   // may run at most --ahead messages past its slowest reading subscriber
	gateGroup // may run at most --ahead messages past what its group has consumed
)

type run struct {
	cfg      config
	runID    uint32
	winStart int64 // measured window, ns since epoch (send time for latency, receive time for rates)
	winEnd   int64
	stop     atomic.Bool
	stopCh   chan struct{}
	closing  atomic.Bool
	gate     int
	pubs     []*publisher
	subs     []*subscriber
	checker  *orderChecker
	// stallFirst is the first stalled reader, once unstall let it read.
	stallFirst *subscriber
	finals     *finalTracker // conflate: the reader's newest value per topic
	keyNames   []string
	streams    int // distinct stream ids (for per-subscriber sequence tracking)
}

type publisher struct {
	r       *run
	idx     int
	m       *mconn
	tmpls   []tmpl
	next    int    // next template (round robin)
	shuffle bool   // pick templates at random instead (keyed streams)
	rng     uint64 // xorshift state for shuffle
	timer   *time.Timer
	tseq    []uint32 // per template sequence
	seq     uint64   // per publisher sequence (messages appended)
	pid     uint16
	buf     []byte
	tsOffs  []int
	pendT   []int32
	sentWin []uint64 // per template, stamped inside the window
	sentAll []uint64 // per template, all
	slots   chan struct{}
	wake    chan struct{}
	// gateGroup
	consumed atomic.Uint64
	wakeAt   atomic.Uint64
	// gateMin cache
	minSeen uint64
	nacks   atomic.Uint64
	err     error
	ackErr  error
	done    chan struct{}
	ackDone chan struct{}
}

type subscriber struct {
	r        *run
	idx      int
	m        *mconn
	filter   string
	stalled  bool
	readRate int // bytes/s it reads at most (0: no limit)
	consumer int // index inside the $share group, -1 if not a group member
	// per publisher
	lastLocal []uint64
	last      []atomic.Uint64
	wakeAt    []atomic.Uint64
	consumed  []uint64
	// per (publisher, stream): next expected sequence
	nextSeq []uint32

	h        hist
	recvWin  uint64 // received inside the window (by receive time)
	winMsgs  uint64 // received messages that were sent inside the window
	total    uint64
	gaps     uint64
	reorders uint64
	// firstLoss is how many messages arrived before the first gap (0: none seen).
	firstLoss uint64
	foreign   uint64
	keyMiss   uint64
	dups      uint64
	viol      uint64
	totalA    atomic.Uint64
	err       error
	done      chan struct{}
}

// ---------------------------------------------------------------- setup

func newRun(cfg config) *run {
	return &run{cfg: cfg, runID: rand.Uint32() | 1, stopCh: make(chan struct{})}
}

func (r *run) dialOpts() dialOpts {
	return dialOpts{proto: r.cfg.proto, timeout: r.cfg.timeout, readBuf: r.cfg.readBuf, keepalive: r.cfg.keepalive}
}

// keepAlive sends PINGREQ on every connection each half keep-alive period
// until stop is closed, so that runs longer than the keep-alive survive
// connections that would otherwise send nothing (QoS 0 subscribers).
func keepAlive(keepalive uint16, conns func() []*mconn, stop <-chan struct{}) {
	if keepalive == 0 {
		return
	}
	t := time.NewTicker(time.Duration(keepalive) * time.Second / 2)
	defer t.Stop()
	ping := mqttwire.AppendPingreq(nil)
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			for _, m := range conns() {
				if m != nil {
					m.c.SetWriteDeadline(time.Now().Add(time.Second))
					m.c.Write(ping)
					m.c.SetWriteDeadline(time.Time{})
				}
			}
		}
	}
}

func (r *run) clientID(role string, i int) string {
	return fmt.Sprintf("lg%08x-%s%d", r.runID, role, i)
}

// newPublisher builds the templates for (topic, key) streams.
type streamSpec struct {
	topic  string
	key    string // MQTT 5 user property value ("" for none)
	stream uint32
	fan    int
}

func (r *run) addPublisher(specs []streamSpec) *publisher {
	p := &publisher{r: r, idx: len(r.pubs), wake: make(chan struct{}, 1), done: make(chan struct{}), ackDone: make(chan struct{})}
	for _, s := range specs {
		t := newTmpl(r.cfg.proto, s.topic, r.cfg.qos, s.key, r.cfg.payload)
		t.stream, t.fan = s.stream, s.fan
		for i := t.payOff + payloadMin; i < len(t.frame); i++ {
			t.frame[i] = 'x'
		}
		p.tmpls = append(p.tmpls, t)
		if s.stream >= uint32(r.streams) {
			r.streams = int(s.stream) + 1
		}
	}
	p.tseq = make([]uint32, len(p.tmpls))
	p.sentWin = make([]uint64, len(p.tmpls))
	p.sentAll = make([]uint64, len(p.tmpls))
	r.pubs = append(r.pubs, p)
	return p
}

func (r *run) addSubscriber(filter string, stalled bool, consumer int) *subscriber {
	s := &subscriber{r: r, idx: len(r.subs), filter: filter, stalled: stalled, consumer: consumer, done: make(chan struct{})}
	r.subs = append(r.subs, s)
	return s
}

// connectAll dials every subscriber (and subscribes) and every publisher,
// at most cfg.conc at a time.
func (r *run) connectAll(ctx context.Context) error {
	np := len(r.pubs)
	for _, s := range r.subs {
		s.lastLocal = make([]uint64, np)
		s.last = make([]atomic.Uint64, np)
		s.wakeAt = make([]atomic.Uint64, np)
		s.consumed = make([]uint64, np)
		s.nextSeq = make([]uint32, np*r.streams)
		for i := range s.nextSeq {
			s.nextSeq[i] = 1
		}
	}
	type job func() error
	var jobs []job
	for _, s := range r.subs {
		jobs = append(jobs, func() error {
			o := r.dialOpts()
			if s.stalled || s.readRate > 0 {
				o.rcvbuf = r.cfg.stallRcvbuf
			}
			o.readRate = s.readRate
			m, err := dialMQTT(ctx, r.subAddr(s.idx), r.clientID("s", s.idx), o)
			if err != nil {
				return err
			}
			if err := m.subscribe(s.filter, r.cfg.qos, r.cfg.timeout); err != nil {
				m.abort()
				return err
			}
			s.m = m
			return nil
		})
	}
	for _, p := range r.pubs {
		jobs = append(jobs, func() error {
			o := r.dialOpts()
			o.readBuf = 16 << 10
			m, err := dialMQTT(ctx, r.cfg.addrs[0], r.clientID("p", p.idx), o)
			if err != nil {
				return err
			}
			p.m = m
			if r.cfg.qos > 0 {
				w := min(r.cfg.inflight, int(m.recvMax))
				p.slots = make(chan struct{}, max(w, 1))
			}
			return nil
		})
	}
	return parallel(ctx, r.cfg.conc, len(jobs), func(i int) error { return jobs[i]() })
}

// subAddr is where subscriber (or group member) i connects: with several
// addresses (a cluster's nodes), each in turn starting with the second, so
// that one subscriber is on another node than the publishers (on the first)
// and many spread evenly.
func (r *run) subAddr(i int) string {
	a := r.cfg.addrs
	return a[(i+1)%len(a)]
}

// parallel runs f(0..n-1) with at most conc running, stopping at the first error.
func parallel(ctx context.Context, conc, n int, f func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	for w := 0; w < min(conc, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errOnce.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// ---------------------------------------------------------------- publisher

func (p *publisher) run(t0 time.Time) {
	defer close(p.done)
	r := p.r
	cfg := r.cfg
	flushAt := cfg.flushBytes
	rate := cfg.rate / float64(len(r.pubs))
	for !r.stop.Load() {
		if cfg.count > 0 && p.seq >= uint64(cfg.count) {
			break
		}
		if rate > 0 {
			due := uint64(rate * time.Since(t0).Seconds())
			if p.seq >= due {
				if err := p.flush(); err != nil {
					p.err = err
					return
				}
				wait := time.Duration(float64(p.seq+1-due) / rate * float64(time.Second))
				time.Sleep(max(wait, 200*time.Microsecond))
				continue
			}
		}
		if r.gate != gateNone && cfg.ahead > 0 && p.seq+1 > uint64(cfg.ahead) {
			if !p.waitGate(p.seq + 1 - uint64(cfg.ahead)) {
				break
			}
		}
		if p.slots != nil {
			select {
			case p.slots <- struct{}{}:
			default:
				if err := p.flush(); err != nil {
					p.err = err
					return
				}
				select {
				case p.slots <- struct{}{}:
				case <-r.stopCh:
					p.flush()
					return
				}
			}
		}
		p.appendOne()
		if len(p.buf) >= flushAt {
			if err := p.flush(); err != nil {
				p.err = err
				return
			}
		}
	}
	if err := p.flush(); err != nil {
		p.err = err
	}
}

func (p *publisher) appendOne() {
	ti := p.next
	if p.shuffle {
		p.rng ^= p.rng << 13
		p.rng ^= p.rng >> 7
		p.rng ^= p.rng << 17
		ti = int(p.rng % uint64(len(p.tmpls)))
	} else if p.next++; p.next == len(p.tmpls) {
		p.next = 0
	}
	t := &p.tmpls[ti]
	start := len(p.buf)
	p.buf = append(p.buf, t.frame...)
	p.seq++
	p.tseq[ti]++
	if t.pidOff >= 0 {
		p.pid++
		if p.pid == 0 {
			p.pid = 1
		}
		binary.BigEndian.PutUint16(p.buf[start+t.pidOff:], p.pid)
	}
	putPayload(p.buf[start+t.payOff:], payloadInfo{run: p.r.runID, pub: uint32(p.idx), seq: p.seq, key: t.stream, keySeq: p.tseq[ti]})
	p.tsOffs = append(p.tsOffs, start+t.payOff+offTS)
	p.pendT = append(p.pendT, int32(ti))
}

// flush stamps every pending message with the current time and writes them
// with one syscall.
func (p *publisher) flush() error {
	if len(p.buf) == 0 {
		return nil
	}
	t := now()
	in := t >= p.r.winStart && t < p.r.winEnd
	for i, off := range p.tsOffs {
		binary.LittleEndian.PutUint64(p.buf[off:], uint64(t))
		ti := p.pendT[i]
		p.sentAll[ti]++
		if in {
			p.sentWin[ti]++
		}
	}
	_, err := p.m.c.Write(p.buf)
	p.buf = p.buf[:0]
	p.tsOffs = p.tsOffs[:0]
	p.pendT = p.pendT[:0]
	return err
}

// waitGate blocks until the readers have come within --ahead of this
// publisher: progress >= target. It returns false if the run stopped. Once
// blocked, it waits for a quarter of the window to free up, so that a
// publisher held by the gate still writes in batches.
func (p *publisher) waitGate(target uint64) bool {
	r := p.r
	slack := uint64(max(r.cfg.ahead/4, 1)) - 1
	if r.gate == gateGroup {
		if p.consumed.Load() >= target {
			return true
		}
		target += slack
		for p.consumed.Load() < target {
			if err := p.flush(); err != nil {
				p.err = err
				return false
			}
			p.wakeAt.Store(target)
			if p.consumed.Load() >= target {
				p.wakeAt.Store(0)
				break
			}
			if !p.sleep() {
				return false
			}
		}
		return true
	}
	// gateMin: the slowest gated subscriber's highest sequence from us.
	if p.minSeen >= target {
		return true
	}
	blocked := false
	for {
		minV, minS := uint64(1<<63), (*subscriber)(nil)
		for _, s := range r.subs {
			if s.stalled || s.consumer >= 0 {
				continue
			}
			if v := s.last[p.idx].Load(); v < minV {
				minV, minS = v, s
			}
		}
		if minS == nil {
			return true
		}
		p.minSeen = minV
		if minV >= target {
			return true
		}
		if !blocked {
			blocked = true
			target += slack
			continue
		}
		if err := p.flush(); err != nil {
			p.err = err
			return false
		}
		minS.wakeAt[p.idx].Store(target)
		if minS.last[p.idx].Load() >= target {
			minS.wakeAt[p.idx].Store(0)
			continue
		}
		if !p.sleep() {
			return false
		}
	}
}

func (p *publisher) sleep() bool {
	if p.timer == nil {
		p.timer = time.NewTimer(50 * time.Millisecond)
	} else {
		p.timer.Reset(50 * time.Millisecond)
	}
	select {
	case <-p.wake:
	case <-p.timer.C:
	case <-p.r.stopCh:
		return false
	}
	return !p.r.stop.Load()
}

// readAcks reads what the broker sends a publisher: PUBACK/PUBREC/PUBCOMP
// release window slots; PUBREC is answered with PUBREL.
func (p *publisher) readAcks() {
	defer close(p.ackDone)
	var out []byte
	for {
		pk, err := p.m.fr.Next()
		if err != nil {
			if !p.r.closing.Load() && !isClosedErr(err) {
				p.ackErr = err
			} else if !p.r.closing.Load() {
				p.ackErr = fmt.Errorf("broker closed the publisher's connection: %w", err)
			}
			return
		}
		switch pk.Type {
		case mqttwire.TypePuback, mqttwire.TypePubcomp:
			if a, err := mqttwire.DecodeAck(p.m.proto, pk); err == nil && a.ReasonCode >= 0x80 {
				p.nacks.Add(1)
			}
			p.release()
		case mqttwire.TypePubrec:
			a, err := mqttwire.DecodeAck(p.m.proto, pk)
			if err != nil {
				p.ackErr = err
				return
			}
			if a.ReasonCode >= 0x80 {
				p.nacks.Add(1)
				p.release()
			} else {
				out = mqttwire.AppendAck(out, mqttwire.TypePubrel, a.PacketID, 0)
			}
		}
		if len(out) > 0 && !p.m.fr.Buffered() {
			if _, err := p.m.c.Write(out); err != nil {
				return
			}
			out = out[:0]
		}
	}
}

func (p *publisher) release() {
	if p.slots == nil {
		return
	}
	select {
	case <-p.slots:
	default:
	}
}

// ---------------------------------------------------------------- subscriber

func (s *subscriber) run() {
	defer close(s.done)
	r := s.r
	proto := r.cfg.proto
	var out []byte
	for {
		pk, err := s.m.fr.Next()
		if err != nil {
			if !r.closing.Load() {
				s.err = fmt.Errorf("subscriber %d: %w", s.idx, err)
			}
			s.endBatch()
			return
		}
		switch pk.Type {
		case mqttwire.TypePublish:
			m, err := mqttwire.DecodePublish(proto, pk)
			if err != nil {
				s.err = fmt.Errorf("subscriber %d: %w", s.idx, err)
				s.endBatch()
				return
			}
			s.handle(&m)
			switch m.QoS {
			case 1:
				out = mqttwire.AppendAck(out, mqttwire.TypePuback, m.PacketID, 0)
			case 2:
				out = mqttwire.AppendAck(out, mqttwire.TypePubrec, m.PacketID, 0)
			}
		case mqttwire.TypePubrel:
			if a, err := mqttwire.DecodeAck(proto, pk); err == nil {
				out = mqttwire.AppendAck(out, mqttwire.TypePubcomp, a.PacketID, 0)
			}
		}
		if !s.m.fr.Buffered() {
			if len(out) > 0 {
				if _, err := s.m.c.Write(out); err != nil && !r.closing.Load() {
					s.err = err
				}
				out = out[:0]
			}
			s.endBatch()
		}
	}
}

func (s *subscriber) handle(m *mqttwire.PublishView) {
	r := s.r
	rt := now()
	pi, ok := getPayload(m.Payload)
	if !ok || pi.run != r.runID || int(pi.pub) >= len(r.pubs) {
		s.foreign++
		return
	}
	s.total++
	if rt >= r.winStart && rt < r.winEnd {
		s.recvWin++
	}
	if pi.ts >= r.winStart && pi.ts < r.winEnd {
		s.winMsgs++
		s.h.record(rt - pi.ts)
	}
	if s.consumer >= 0 {
		s.consumed[pi.pub]++
		if r.checker != nil {
			dup, viol := r.checker.observe(pi.key, pi.keySeq, s.consumer)
			if dup {
				s.dups++
			}
			if viol {
				s.viol++
			}
			if r.cfg.keyMode == "prop" {
				key, ok := m.Props.UserValue(keyProperty)
				if !ok || int(pi.key) >= len(r.keyNames) || string(key) != r.keyNames[pi.key] {
					s.keyMiss++
				}
			}
		}
		return
	}
	if pi.seq > s.lastLocal[pi.pub] {
		s.lastLocal[pi.pub] = pi.seq
	}
	if r.finals != nil {
		r.finals.observe(pi.key, pi.keySeq)
	}
	if int(pi.key) < r.streams {
		i := int(pi.pub)*r.streams + int(pi.key)
		n := s.nextSeq[i]
		switch {
		case pi.keySeq == n:
			s.nextSeq[i] = n + 1
		case pi.keySeq > n:
			if s.gaps == 0 {
				s.firstLoss = s.total - 1
			}
			s.gaps += uint64(pi.keySeq - n)
			s.nextSeq[i] = pi.keySeq + 1
		default:
			s.reorders++
		}
	}
}

// endBatch publishes this subscriber's progress when its input buffer is
// empty (before it blocks on the socket) and wakes a publisher waiting on it.
func (s *subscriber) endBatch() {
	r := s.r
	s.totalA.Store(s.total)
	if s.consumer >= 0 {
		for i, c := range s.consumed {
			if c == 0 {
				continue
			}
			s.consumed[i] = 0
			p := r.pubs[i]
			v := p.consumed.Add(c)
			if w := p.wakeAt.Load(); w != 0 && v >= w && p.wakeAt.CompareAndSwap(w, 0) {
				notify(p.wake)
			}
		}
		return
	}
	for i, v := range s.lastLocal {
		if s.last[i].Load() != v {
			s.last[i].Store(v)
		}
		if w := s.wakeAt[i].Load(); w != 0 && v >= w && s.wakeAt[i].CompareAndSwap(w, 0) {
			notify(r.pubs[i].wake)
		}
	}
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// ---------------------------------------------------------------- the measured run

type result struct {
	Scenario  string   `json:"scenario"`
	Label     string   `json:"label,omitempty"`
	Tag       string   `json:"tag,omitempty"`
	Round     int      `json:"round,omitempty"`
	Addr      string   `json:"addr"`
	Args      []string `json:"args"`
	OK        bool     `json:"ok"`
	Errors    []string `json:"errors,omitempty"`
	Notes     []string `json:"notes,omitempty"`
	Proto     int      `json:"proto"`
	QoS       int      `json:"qos"`
	Payload   int      `json:"payload"`
	Pubs      int      `json:"publishers"`
	Subs      int      `json:"subscribers"`
	Stalled   int      `json:"stalled,omitempty"`
	Consumers int      `json:"consumers,omitempty"`
	Topics    int      `json:"topics,omitempty"`
	KeyMode   string   `json:"key_mode,omitempty"`
	Rate      float64  `json:"rate"`
	Ahead     int      `json:"ahead"`
	Window    float64  `json:"window_s"`

	Published       uint64        `json:"published"`
	PublishedPerS   float64       `json:"published_per_s"`
	Delivered       uint64        `json:"delivered"`
	DeliveredPerS   float64       `json:"delivered_per_s"`
	Expected        uint64        `json:"expected"`
	DeliveredRatio  float64       `json:"delivered_ratio"`
	Latency         latencyJSON   `json:"latency_us"`
	Gaps            uint64        `json:"gaps"`
	Reorders        uint64        `json:"reorders"`
	Foreign         uint64        `json:"foreign,omitempty"`
	PubNacks        uint64        `json:"pub_nacks,omitempty"`
	PublishedAll    uint64        `json:"published_all"`
	DeliveredAll    uint64        `json:"delivered_all"`
	Order           *orderJSON    `json:"order,omitempty"`
	KeyPropMissing  uint64        `json:"key_prop_missing,omitempty"`
	MsgsPerConsumer []uint64      `json:"msgs_per_consumer,omitempty"`
	CPU             cpuJSON       `json:"cpu"`
	RSS             *rssJSON      `json:"broker_rss,omitempty"`
	Stall           *stallJSON    `json:"stalled_readers,omitempty"`
	Connections     *connJSON     `json:"connections,omitempty"`
	Conflate        *conflateJSON `json:"conflate,omitempty"`
	Sessions        *sessionsJSON `json:"sessions,omitempty"`
	Wake            *wakeJSON     `json:"wake,omitempty"`
	ElapsedS        float64       `json:"elapsed_s"`
}

func (r *run) execute(ctx context.Context, res *result) {
	cfg := r.cfg
	started := time.Now()
	if err := r.connectAll(ctx); err != nil {
		res.Errors = append(res.Errors, "connect: "+err.Error())
		r.closeAll()
		return
	}
	for _, s := range r.subs {
		if !s.stalled {
			go s.run()
		} else {
			close(s.done)
		}
	}
	for _, p := range r.pubs {
		go p.readAcks()
	}
	rss := startRSS(cfg.brokerPID, cfg.rssEvery)
	kaStop := make(chan struct{})
	defer close(kaStop)
	go keepAlive(cfg.keepalive, func() []*mconn {
		var ms []*mconn
		for _, p := range r.pubs {
			ms = append(ms, p.m)
		}
		for _, s := range r.subs {
			if !s.stalled { // a stalled reader's broker side may be blocked; it may time out
				ms = append(ms, s.m)
			}
		}
		return ms
	}, kaStop)

	t0 := time.Now()
	counted := cfg.count > 0
	if counted {
		// Count mode: every message counts; rates run over the whole run.
		r.winStart, r.winEnd = now(), math.MaxInt64
	} else {
		r.winStart = now() + int64(cfg.warmup)
		r.winEnd = r.winStart + int64(cfg.duration)
	}
	for _, p := range r.pubs {
		go p.run(t0)
	}
	var c0, c1 cpuSnap
	var recv0, recv1 uint64
	window := cfg.duration.Seconds()
	if counted {
		c0 = snapCPU(cfg.brokerPIDs)
		allDone := make(chan struct{})
		go func() {
			for _, p := range r.pubs {
				<-p.done
			}
			close(allDone)
		}()
		cap := time.NewTimer(cfg.duration)
		select {
		case <-allDone:
		case <-cap.C:
			res.Errors = append(res.Errors, fmt.Sprintf("publishers did not send -count %d messages within -duration %s", cfg.count, cfg.duration))
		}
		cap.Stop()
		window = time.Since(t0).Seconds()
	} else {
		time.Sleep(cfg.warmup)
		c0 = snapCPU(cfg.brokerPIDs)
		recv0 = r.received()
		time.Sleep(cfg.duration)
		c1 = snapCPU(cfg.brokerPIDs)
		recv1 = r.received()
	}
	r.stop.Store(true)
	close(r.stopCh)
	for _, p := range r.pubs {
		<-p.done
	}

	// Drain: wait until every expected delivery arrived or progress stops
	// (conflate: until every topic's last value arrived).
	expAll := r.expectedAll()
	stopped := time.Now()
	var finalAt time.Time
	if r.finals != nil {
		r.finals.setFinal(r.publishedFinals())
	}
	deadline := time.Now().Add(cfg.drain)
	lastN, lastChange := r.received(), time.Now()
	for time.Now().Before(deadline) {
		n := r.received()
		if r.finals != nil {
			if int(r.finals.done.Load()) == max(cfg.topics, 1) {
				finalAt = time.Now()
				break
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if n >= expAll {
			break
		}
		if n != lastN {
			lastN, lastChange = n, time.Now()
		} else if time.Since(lastChange) > r.cfg.drainIdle {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if counted {
		c1 = snapCPU(cfg.brokerPIDs)
		recv1 = r.received()
	}
	res.RSS = rss.finish(cfg.scenario == "slowsub" || cfg.scenario == "conflate")
	if cfg.stalled > 0 {
		res.Stall = r.unstall()
	}
	r.closeAll()
	if r.finals != nil {
		r.conflateResult(res, stopped, finalAt)
	}

	// Collect.
	w := window
	res.Window = round3(w)
	var h hist
	for _, p := range r.pubs {
		if p.err != nil && !isClosedErr(p.err) {
			res.Errors = append(res.Errors, fmt.Sprintf("publisher %d: %v", p.idx, p.err))
		}
		if p.ackErr != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("publisher %d: %v", p.idx, p.ackErr))
		}
		res.PubNacks += p.nacks.Load()
		for ti, t := range p.tmpls {
			res.Published += p.sentWin[ti]
			res.PublishedAll += p.sentAll[ti]
			res.Expected += p.sentWin[ti] * uint64(t.fan)
		}
	}
	for _, s := range r.subs {
		if s.stalled || s.m == nil {
			continue
		}
		select {
		case <-s.done:
		default:
			res.Errors = append(res.Errors, fmt.Sprintf("subscriber %d did not stop after its connection closed", s.idx))
			continue
		}
		if s.err != nil {
			res.Errors = append(res.Errors, s.err.Error())
		}
		h.merge(&s.h)
		res.Delivered += s.winMsgs
		res.DeliveredAll += s.total
		res.Gaps += s.gaps
		res.Reorders += s.reorders
		res.Foreign += s.foreign
		res.KeyPropMissing += s.keyMiss
		if s.consumer >= 0 {
			res.MsgsPerConsumer = append(res.MsgsPerConsumer, s.total)
		}
	}
	if st := r.stallFirst; st != nil && res.Stall != nil {
		select {
		case <-st.done:
			res.Stall.FirstLossAfter = res.Stall.Received // lost at the tail, if at all
			if st.gaps > 0 {
				res.Stall.FirstLossAfter = st.firstLoss
			}
		default:
			res.Errors = append(res.Errors, "the stalled reader did not stop after its connection closed")
		}
	}
	res.PublishedPerS = round3(float64(res.Published) / w)
	res.DeliveredPerS = round3(float64(recv1-recv0) / c1.wall.Sub(c0.wall).Seconds())
	if res.Expected > 0 {
		res.DeliveredRatio = round3(float64(res.Delivered) / float64(res.Expected))
	}
	res.Latency = h.summary()
	res.CPU = cpuBetween(c0, c1, runtime.NumCPU(), recv1-recv0)
	if r.checker != nil {
		o := r.checker.result(res.PublishedAll)
		res.Order = &o
	}
	res.ElapsedS = round3(time.Since(started).Seconds())
}

// stallJSON is what the stalled readers got once they read again: the
// backlog the broker held for them. Missing = published - received (the
// messages it dropped); FirstLossAfter = messages received in order before
// the first one missing, the bound the broker kept to before it dropped.
type stallJSON struct {
	Readers        int     `json:"readers"`
	Published      uint64  `json:"published"`
	Received       uint64  `json:"received"`
	Missing        uint64  `json:"missing"`
	FirstLossAfter uint64  `json:"first_loss_after,omitempty"`
	DrainS         float64 `json:"drain_s"`
}

// unstall makes the stalled readers read what the broker kept for them,
// after publishing stopped and the RSS was taken, until they have every
// message published or a second passes without progress (at most
// cfg.drain + 5 s), and reports the figures of the first one.
func (r *run) unstall() *stallJSON {
	var stalled []*subscriber
	for _, s := range r.subs {
		if s.stalled && s.m != nil {
			s.done = make(chan struct{})
			stalled = append(stalled, s)
			go s.run()
		}
	}
	if len(stalled) == 0 {
		return nil
	}
	start := time.Now()
	var want uint64 // the first stalled reader takes topic 0: template 0 of every publisher
	for _, p := range r.pubs {
		want += p.sentAll[0]
	}
	got := func() uint64 { return stalled[0].totalA.Load() }
	deadline := start.Add(r.cfg.drain + 5*time.Second)
	last, lastChange := got(), time.Now()
	for time.Now().Before(deadline) && got() < want {
		if n := got(); n != last {
			last, lastChange = n, time.Now()
		} else if time.Since(lastChange) > r.cfg.drainIdle {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := stalled[0]
	// The reader's own counters are its goroutine's until it stops: the
	// first loss is read after closeAll.
	st := &stallJSON{Readers: len(stalled), Published: want, Received: got(), DrainS: round3(time.Since(start).Seconds())}
	if st.Published > st.Received {
		st.Missing = st.Published - st.Received
	}
	r.stallFirst = s
	return st
}

// received is the number of deliveries so far to reading subscribers
// (updated by each subscriber at the end of every read batch).
func (r *run) received() uint64 {
	var n uint64
	for _, s := range r.subs {
		if !s.stalled {
			n += s.totalA.Load()
		}
	}
	return n
}

func (r *run) expectedAll() uint64 {
	var n uint64
	for _, p := range r.pubs {
		for ti, t := range p.tmpls {
			n += p.sentAll[ti] * uint64(t.fan)
		}
	}
	return n
}

func (r *run) closeAll() {
	r.closing.Store(true)
	if !r.stop.Load() {
		r.stop.Store(true)
		close(r.stopCh)
	}
	for _, p := range r.pubs {
		if p.m != nil {
			p.m.close()
		}
	}
	for _, s := range r.subs {
		if s.m == nil {
			continue
		}
		if s.stalled {
			s.m.abort() // its socket is full: a DISCONNECT could block
		} else {
			s.m.close()
		}
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for _, s := range r.subs {
		if s.m == nil {
			continue
		}
		select {
		case <-s.done:
		case <-t.C:
			return
		}
	}
}

// ---------------------------------------------------------------- scenarios

func setupFanout(r *run) error {
	cfg := r.cfg
	t := max(cfg.topics, 1)
	fan := make([]int, t)
	for j := 0; j < cfg.subs; j++ {
		fan[j%t]++
		r.addSubscriber(fanoutTopic(j%t), false, -1)
	}
	for j := 0; j < cfg.stalled; j++ {
		r.addSubscriber(fanoutTopic(j%t), true, -1)
	}
	for i := 0; i < cfg.pubs; i++ {
		specs := make([]streamSpec, t)
		for k := range specs {
			specs[k] = streamSpec{topic: fanoutTopic(k), stream: uint32(k), fan: fan[k]}
		}
		r.addPublisher(specs)
	}
	r.gate = gateMin
	if cfg.ahead > 0 && cfg.ahead < 2*t {
		r.cfg.ahead = 2 * t
	}
	return nil
}

func fanoutTopic(i int) string { return "bench/fanout/" + strconv.Itoa(i) }

func setupFanin(r *run) error {
	cfg := r.cfg
	filter := "bench/fanin/+"
	fan := cfg.subs
	if cfg.group {
		filter = "$share/lg/" + filter
		fan = 1
		r.gate = gateGroup
	} else {
		r.gate = gateMin
	}
	for j := 0; j < cfg.subs; j++ {
		c := -1
		if cfg.group {
			c = j
		}
		r.addSubscriber(filter, false, c)
	}
	for i := 0; i < cfg.pubs; i++ {
		r.addPublisher([]streamSpec{{topic: "bench/fanin/" + strconv.Itoa(i), stream: 0, fan: fan}})
	}
	return nil
}

func setupShared(r *run) error {
	cfg := r.cfg
	if cfg.keyMode == "prop" && cfg.proto != 5 {
		return fmt.Errorf("--key-mode prop needs --proto 5 (user properties are MQTT 5)")
	}
	if cfg.keys < 1 || cfg.consumers < 1 || cfg.groups < 1 || cfg.groups > cfg.keys {
		return fmt.Errorf("--keys and --consumers must be at least 1, --groups between 1 and --keys")
	}
	r.keyNames = make([]string, cfg.keys)
	for k := range r.keyNames {
		r.keyNames[k] = "k" + strconv.Itoa(k)
	}
	// One group: $share/lg/bench/shared as always; several: group g is
	// $share/lg<g>/bench/shared/g<g> and takes the keys k with k % groups == g.
	base := func(g int) string {
		if cfg.groups == 1 {
			return "bench/shared"
		}
		return "bench/shared/g" + strconv.Itoa(g)
	}
	for j := 0; j < cfg.consumers*cfg.groups; j++ {
		g := j % cfg.groups
		filter := "$share/lg/" + base(g)
		if cfg.groups > 1 {
			filter = "$share/lg" + strconv.Itoa(g) + "/" + base(g)
		}
		if cfg.keyMode == "topic" {
			filter += "/+"
		}
		r.addSubscriber(filter, false, j)
	}
	pubs := min(cfg.pubs, cfg.keys)
	r.cfg.pubs = pubs
	for i := 0; i < pubs; i++ {
		var specs []streamSpec
		for k := i; k < cfg.keys; k += pubs {
			s := streamSpec{topic: base(k % cfg.groups), stream: uint32(k), fan: 1}
			if cfg.keyMode == "topic" {
				s.topic += "/" + r.keyNames[k]
			} else {
				s.key = r.keyNames[k]
			}
			specs = append(specs, s)
		}
		p := r.addPublisher(specs)
		p.shuffle, p.rng = true, uint64(r.runID)<<32|uint64(i+1)
	}
	r.checker = newOrderChecker(cfg.keys, cfg.consumers*cfg.groups)
	r.gate = gateGroup
	return nil
}
