package ops

import (
	"sort"
	"sync"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// The sampler keeps the last few minutes of the broker's counters, and of the
// groups someone looks at, so the console (and GET /api/v1/overview and
// /api/v1/groups/activity) can draw rates without external monitoring. It
// reads counters once per sampleEvery on its own goroutine; nothing is added
// to the publish path.

const (
	sampleEvery   = time.Second
	sampleHistory = 300 // intervals kept: five minutes
	// A group is sampled for groupWatchTTL after the last request for its
	// activity; at most maxWatchedGroups at once (the least recently asked
	// for goes first).
	groupWatchTTL    = 10 * time.Minute
	maxWatchedGroups = 32
)

// totals are the broker counters one sample holds.
type totals struct {
	at                          time.Time
	in, out, dropped, bin, bout uint64
	clients                     int64
}

// groupTotals are the group counters one sample holds.
type groupTotals struct {
	at                           time.Time
	head, delivered, acked, dead uint64
	backlog                      uint64
	inFlight                     int
}

type groupSeries struct {
	lastAsked time.Time
	samples   []groupTotals // oldest first, at most sampleHistory+1
}

// sampler holds the samples; its methods are safe for concurrent use.
type sampler struct {
	mu struct {
		sync.Mutex
		totals []totals // oldest first, at most sampleHistory+1
		groups map[string]*groupSeries
	}
}

// addTotals records a sample of the broker's counters.
func (s *sampler) addTotals(t totals) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.totals = appendBounded(s.mu.totals, t)
}

// watch marks group as asked for at now, so that it is sampled.
func (s *sampler) watch(group string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.groups == nil {
		s.mu.groups = map[string]*groupSeries{}
	}
	g := s.mu.groups[group]
	if g == nil {
		if len(s.mu.groups) >= maxWatchedGroups {
			oldest := ""
			for name, o := range s.mu.groups {
				if oldest == "" || o.lastAsked.Before(s.mu.groups[oldest].lastAsked) {
					oldest = name
				}
			}
			delete(s.mu.groups, oldest)
		}
		g = &groupSeries{}
		s.mu.groups[group] = g
	}
	g.lastAsked = now
}

// watched returns the groups to sample at now, forgetting those nobody asked
// for within groupWatchTTL.
func (s *sampler) watched(now time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, g := range s.mu.groups {
		if now.Sub(g.lastAsked) > groupWatchTTL {
			delete(s.mu.groups, name)
			continue
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// addGroup records a sample of a watched group; a group no longer watched
// (or deleted: forget) is skipped.
func (s *sampler) addGroup(group string, t groupTotals) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.mu.groups[group]; g != nil {
		if n := len(g.samples); n > 0 {
			last := g.samples[n-1]
			if t.head < last.head || t.delivered < last.delivered || t.acked < last.acked || t.dead < last.dead {
				g.samples = g.samples[:0] // the group or its dispatcher started over
			}
		}
		g.samples = appendBounded(g.samples, t)
	}
}

// forget stops sampling group.
func (s *sampler) forget(group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.groups, group)
}

// overview returns the broker's history, oldest first, and the rates over
// the last few intervals (nil before two samples).
func (s *sampler) overview() (history []adminapi.OverviewSample, recent *adminapi.OverviewSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.mu.totals
	history = make([]adminapi.OverviewSample, 0, max(len(ts)-1, 0))
	for i := 1; i < len(ts); i++ {
		history = append(history, totalsRate(ts[i-1], ts[i]))
	}
	if n := len(ts); n >= 2 {
		r := totalsRate(ts[max(n-6, 0)], ts[n-1]) // about five seconds
		recent = &r
	}
	return history, recent
}

// groupHistory returns a watched group's history, oldest first.
func (s *sampler) groupHistory(group string) []adminapi.GroupSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []adminapi.GroupSample{}
	g := s.mu.groups[group]
	if g == nil {
		return out
	}
	for i := 1; i < len(g.samples); i++ {
		a, b := g.samples[i-1], g.samples[i]
		sec := b.at.Sub(a.at).Seconds()
		if sec <= 0 {
			continue
		}
		out = append(out, adminapi.GroupSample{
			At: b.at, Published: perSec(a.head, b.head, sec), Delivered: perSec(a.delivered, b.delivered, sec),
			Acked: perSec(a.acked, b.acked, sec), DeadLettered: perSec(a.dead, b.dead, sec),
			Backlog: b.backlog, InFlight: b.inFlight,
		})
	}
	return out
}

func totalsRate(a, b totals) adminapi.OverviewSample {
	sec := b.at.Sub(a.at).Seconds()
	if sec <= 0 {
		return adminapi.OverviewSample{At: b.at, ClientsConnected: b.clients}
	}
	return adminapi.OverviewSample{
		At: b.at, MessagesIn: perSec(a.in, b.in, sec), MessagesOut: perSec(a.out, b.out, sec),
		Dropped: perSec(a.dropped, b.dropped, sec), BytesIn: perSec(a.bin, b.bin, sec), BytesOut: perSec(a.bout, b.bout, sec),
		ClientsConnected: b.clients,
	}
}

// perSec is the rate of a counter that went from a to b in sec seconds; a
// counter that went backwards (started over) counts as idle.
func perSec(a, b uint64, sec float64) float64 {
	if b < a {
		return 0
	}
	return float64(b-a) / sec
}

func appendBounded[T any](s []T, v T) []T {
	if len(s) > sampleHistory {
		s = append(s[:0], s[len(s)-sampleHistory:]...)
	}
	return append(s, v)
}
