package ops

import (
	"fmt"
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
	if _, err := w.open("$share/g/a/#", "192.0.2.1:1", nil, now); err == nil || !strings.Contains(err.Error(), "shared subscription") {
		t.Errorf("a shared filter: %v", err)
	}
	if _, err := w.open("a/#/b", "192.0.2.1:1", nil, now); err == nil {
		t.Error("an invalid filter was accepted")
	}
	if w.watching() {
		t.Error("watching with no stream open")
	}
	var vs []*topicViewer
	for i := range maxTopicViewers {
		v, err := w.open("a/#", fmt.Sprintf("192.0.2.%d:1", i), nil, now)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
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
	if _, err := w.open("a/#", "192.0.2.1:1", nil, now); err != errWatchClosed {
		t.Errorf("open after close: %v", err)
	}
}

// TestTopicViewersMakeRoom: a viewer past maxTopicViewers takes the place of
// the oldest stream of the address holding the most (idle viewers made it
// 429); a viewer sees only what its canRead allows.
func TestTopicViewersMakeRoom(t *testing.T) {
	w := newTopicWatch()
	t.Cleanup(w.close) // after the streams' done, registered below (cleanups run last first)
	now := time.Unix(1000, 0)
	open := func(remote string, canRead func(string) bool) *topicViewer {
		v, err := w.open("a/#", remote, canRead, now)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.done(v) })
		return v
	}
	operator := open("192.0.2.1:1", nil)
	var idle []*topicViewer
	for i := range maxTopicViewers - 1 {
		idle = append(idle, open(fmt.Sprintf("198.51.100.7:%d", i), nil))
	}
	replaced := func(v *topicViewer) bool {
		select {
		case <-v.replaced:
			return true
		default:
			return false
		}
	}
	late := open("192.0.2.1:2", func(topic string) bool { return topic != "a/secret" })
	if replaced(operator) || !replaced(idle[0]) || replaced(idle[1]) {
		t.Fatalf("replaced: operator %v, idle[0] %v, idle[1] %v; want only the oldest of the address holding the most", replaced(operator), replaced(idle[0]), replaced(idle[1]))
	}
	for _, topic := range []string{"a/secret", "a/public"} {
		w.publish(topic, 0, false, nil, now)
	}
	if ev := <-late.ch; ev.Topic != "a/public" || len(late.ch) != 0 {
		t.Fatalf("the restricted viewer got %s (and %d more)", ev.Topic, len(late.ch))
	}
	if len(operator.ch) != 2 {
		t.Fatalf("the unrestricted viewer got %d messages, want 2", len(operator.ch))
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
