package ops

import (
	"sync"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// rateTracker keeps recent samples of each group's counters, taken whenever
// the API or a metrics scrape looks at the group, to derive rates cheaply.
type rateTracker struct {
	mu      sync.Mutex
	samples map[string][]rateSample // oldest first, at least rateMinSpan apart
}

type rateSample struct {
	at                           time.Time
	head, delivered, acked, dead uint64
}

const (
	rateMinSpan = time.Second
	rateMaxAge  = time.Minute
)

// observe records s for group and returns the rates since the oldest sample
// kept, nil if there is none rateMinSpan old.
func (t *rateTracker) observe(group string, s rateSample) *adminapi.GroupRates {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.samples == nil {
		t.samples = map[string][]rateSample{}
	}
	ss := t.samples[group]
	if n := len(ss); n > 0 {
		last := ss[n-1]
		if s.head < last.head || s.delivered < last.delivered || s.acked < last.acked || s.dead < last.dead {
			ss = ss[:0] // the group or its dispatcher started over
		}
	}
	// Drop samples too old to matter, keeping the newest of them as the base.
	for len(ss) > 1 && !ss[1].at.After(s.at.Add(-rateMaxAge)) {
		ss = ss[1:]
	}
	var rates *adminapi.GroupRates
	if len(ss) > 0 {
		if span := s.at.Sub(ss[0].at); span >= rateMinSpan {
			base, sec := ss[0], span.Seconds()
			rates = &adminapi.GroupRates{
				WindowSeconds: sec,
				Published:     float64(s.head-base.head) / sec,
				Delivered:     float64(s.delivered-base.delivered) / sec,
				Acked:         float64(s.acked-base.acked) / sec,
				DeadLettered:  float64(s.dead-base.dead) / sec,
			}
		}
	}
	if len(ss) == 0 || s.at.Sub(ss[len(ss)-1].at) >= rateMinSpan {
		ss = append(ss, s)
	}
	t.samples[group] = ss
	return rates
}

// retain forgets the groups not in names.
func (t *rateTracker) retain(names map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for g := range t.samples {
		if !names[g] {
			delete(t.samples, g)
		}
	}
}
