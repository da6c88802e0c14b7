package ops

import (
	"fmt"
	"testing"
	"time"
)

func TestSamplerRatesAndBounds(t *testing.T) {
	var s sampler
	t0 := time.Unix(1000, 0)
	if h, r := s.overview(); len(h) != 0 || r != nil {
		t.Fatalf("empty sampler: %v %v", h, r)
	}
	for i := range sampleHistory + 50 {
		s.addTotals(totals{at: t0.Add(time.Duration(i) * time.Second), in: uint64(10 * i), out: uint64(20 * i), bout: uint64(1000 * i), clients: int64(i % 3)})
	}
	h, r := s.overview()
	if len(h) != sampleHistory {
		t.Fatalf("history of %d, want %d", len(h), sampleHistory)
	}
	last := h[len(h)-1]
	if last.MessagesIn != 10 || last.MessagesOut != 20 || last.BytesOut != 1000 || !last.At.Equal(t0.Add((sampleHistory+49)*time.Second)) {
		t.Errorf("last sample %+v", last)
	}
	if r == nil || r.MessagesIn != 10 || r.MessagesOut != 20 {
		t.Errorf("recent rates %+v", r)
	}
	// A counter that goes backwards counts as idle, not as a huge rate.
	s.addTotals(totals{at: t0.Add(10000 * time.Second)})
	if h, _ := s.overview(); h[len(h)-1].MessagesIn != 0 {
		t.Errorf("after a reset: %+v", h[len(h)-1])
	}
}

func TestSamplerWatchesFewGroupsForAWhile(t *testing.T) {
	var s sampler
	t0 := time.Unix(1000, 0)
	for i := range maxWatchedGroups + 5 {
		s.watch(fmt.Sprintf("g%02d/x", i), t0.Add(time.Duration(i)*time.Second))
	}
	w := s.watched(t0.Add(time.Minute))
	if len(w) != maxWatchedGroups || w[0] != "g05/x" {
		t.Fatalf("watching %d groups from %v, want %d from g05/x (the oldest asked for go first)", len(w), w[0], maxWatchedGroups)
	}
	for i := range 3 {
		s.addGroup("g10/x", groupTotals{at: t0.Add(time.Duration(i) * time.Second), delivered: uint64(5 * i), acked: uint64(4 * i), backlog: 7})
	}
	s.addGroup("g00/x", groupTotals{at: t0}) // no longer watched: ignored
	h := s.groupHistory("g10/x")
	if len(h) != 2 || h[1].Delivered != 5 || h[1].Acked != 4 || h[1].Backlog != 7 {
		t.Errorf("history %+v", h)
	}
	if h := s.groupHistory("g00/x"); len(h) != 0 {
		t.Errorf("unwatched group has history %+v", h)
	}
	if w := s.watched(t0.Add(time.Hour)); len(w) != 0 {
		t.Errorf("still watching %v an hour after anyone asked", w)
	}
}
