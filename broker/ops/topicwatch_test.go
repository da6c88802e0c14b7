package ops

import (
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

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
	if w.watching() {
		t.Error("watching with no stream open")
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
	payload := make([]byte, 5000)
	for range 1000 {
		w.publish("a/b", 0, false, payload, now)
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
	w.publish("a/b", 0, false, payload, now.Add(100*time.Millisecond))
	if len(v.ch) != before+1 {
		t.Error("no token after 100 ms")
	}
	if !w.watching() {
		t.Error("not watching with streams open")
	}
	for _, v := range vs {
		w.done(v)
	}
	if w.watching() {
		t.Error("still watching after every stream ended")
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
