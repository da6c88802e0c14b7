package broker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/adminapi"
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

func TestTopicMatch(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true}, {"a/b", "a/c", false}, {"a/b", "a/b/c", false}, {"a/b/c", "a/b", false},
		{"a/+", "a/b", true}, {"a/+", "a/", true}, {"a/+", "a", false}, {"a/+/c", "a/x/c", true},
		{"a/#", "a", true}, {"a/#", "a/b/c", true}, {"a/#", "ab", false}, {"#", "a/b", true}, {"#", "/", true},
		{"+/+", "/x", true}, {"#", "$SYS/x", false}, {"+/x", "$dlq/x", false}, {"$dlq/#", "$dlq/a/b", true},
		{"+", "a", true}, {"+", "a/b", false}, {"/a", "/a", true}, {"a//b", "a//b", true}, {"a/+/b", "a//b", true},
	} {
		if got := topicMatch(strings.Split(c.filter, "/"), c.topic); got != c.want {
			t.Errorf("topicMatch(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}

func TestTopicWatchIsBounded(t *testing.T) {
	w := newTopicWatch()
	now := time.Unix(1000, 0)
	if _, err := w.open("$share/g/a/#", now); err == nil || !strings.Contains(err.Error(), "shared subscription") {
		t.Errorf("a shared filter: %v", err)
	}
	if _, err := w.open("a/#/b", now); err == nil {
		t.Error("an invalid filter was accepted")
	}
	var vs []*topicViewer
	for range maxTopicViewers {
		v, err := w.open("a/#", now)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	if _, err := w.open("a/#", now); err != errTooManyViewers {
		t.Errorf("viewer %d: %v, want errTooManyViewers", maxTopicViewers+1, err)
	}
	// A burst far above the rate: each viewer gets its bucket's worth, at
	// most its buffer, and counts the rest as skipped.
	pk := packets.Packet{TopicName: "a/b", Payload: make([]byte, 5000)}
	for range 1000 {
		w.publish(&pk, now)
	}
	v := vs[0]
	if got := len(v.ch); got != min(topicRate, topicBuffer) {
		t.Errorf("buffered %d, want %d", got, min(topicRate, topicBuffer))
	}
	if got := v.skipped.Load(); got != 1000-uint64(len(v.ch)) {
		t.Errorf("skipped %d, want %d", got, 1000-len(v.ch))
	}
	ev := <-v.ch
	if ev.PayloadSize != 5000 || len(ev.Payload) != adminapi.MaxPreviewBytes || !ev.Truncated || ev.PayloadEncoding != "utf-8" {
		t.Errorf("event %+v", ev)
	}
	// Tokens come back with time.
	<-v.ch
	before := len(v.ch)
	w.publish(&pk, now.Add(100*time.Millisecond))
	if len(v.ch) != before+1 {
		t.Error("no token after 100 ms")
	}
	for _, v := range vs {
		w.done(v)
	}
	w.close()
	if _, err := w.open("a/#", now); err != errWatchClosed {
		t.Errorf("open after close: %v", err)
	}
}

func TestPreviewPayload(t *testing.T) {
	text := strings.Repeat("é", adminapi.MaxPreviewBytes) // 2 bytes each: the cut falls inside one
	p, enc, cut := previewPayload([]byte(text))
	if enc != "utf-8" || !cut || len(p) > adminapi.MaxPreviewBytes || len(p) < adminapi.MaxPreviewBytes-4 {
		t.Errorf("cut text: %d bytes %s %v", len(p), enc, cut)
	}
	if p, enc, cut := previewPayload([]byte{0xff, 0x00}); p != "/wA=" || enc != "base64" || cut {
		t.Errorf("binary: %q %s %v", p, enc, cut)
	}
}
