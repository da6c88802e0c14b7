package ops

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/share"
)

// A topic watch shows an operator the messages published on a topic filter
// (GET /api/v1/topics/stream, the console's Topics page), like mosquitto_sub -v.
// It is fed from the observer hook's OnPublished (hooks.Observe, through
// Service.Published), after mochi and Keyline's hooks have handled the publish, so it changes nothing in routing: no
// subscription is added to mochi's index (an inline subscription would take
// matching topics off the fan-out fast path). It must never slow a publisher:
//
//   - with no viewer, a publish costs one atomic load (the hook is not called);
//   - at most maxTopicViewers streams are open at once; one more takes the
//     place of the oldest stream of the address that holds the most, so
//     idle viewers cannot keep the operator out (they made it 429) and a
//     flood of streams from one address replaces its own first;
//   - each stream sends at most topicRate messages a second (a token bucket
//     checked before anything is copied); the rest are counted as skipped;
//   - a publish is handed over with a non-blocking send into a small buffer,
//     and copies at most adminapi.MaxPreviewBytes of the payload.
//
// What a viewer may see follows the broker's auth (Broker.topicReader): with
// no auth ledger every topic; with one, the read ACL of http-topic-user when
// it is set, else every topic for a holder of the http token, and nothing
// (the stream is refused) when neither is set: any local process could
// otherwise read the topics the ACL denies it over MQTT.

// MaxTopicViewers is the most topic streams open at once.
const MaxTopicViewers = maxTopicViewers

const (
	maxTopicViewers  = 8
	topicRate        = 50 // messages a second per stream, and the burst
	topicBuffer      = 64
	maxTopicRetained = topicRate // retained messages sent when a stream opens
)

var (
	errWatchClosed = errors.New("the broker is shutting down")
	errReplaced    = fmt.Errorf("a newer topic stream took this one's place (at most %d are open at once)", maxTopicViewers)
)

// topicViewer is one open stream.
type topicViewer struct {
	filter string
	levels []string
	ch     chan adminapi.TopicEvent
	addr   string // the viewer's address (host)
	// canRead, when set, says which topics the viewer may see.
	canRead func(topic string) bool
	// replaced is closed when a newer stream took this one's place.
	replaced chan struct{}

	mu struct {
		sync.Mutex
		tokens float64
		last   time.Time
	}
	sent, skipped atomic.Uint64
}

// take spends a token of the viewer's rate, reporting whether one was left.
func (v *topicViewer) take(now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.mu.tokens = min(topicRate, v.mu.tokens+now.Sub(v.mu.last).Seconds()*topicRate)
	v.mu.last = now
	if v.mu.tokens < 1 {
		return false
	}
	v.mu.tokens--
	return true
}

// offer hands ev to the viewer without waiting; it reports whether it fit.
func (v *topicViewer) offer(ev adminapi.TopicEvent) bool {
	select {
	case v.ch <- ev:
		return true
	default:
		v.skipped.Add(1)
		return false
	}
}

// topicWatch holds the open streams.
type topicWatch struct {
	viewers atomic.Pointer[[]*topicViewer] // read on every publish; nil or empty: nobody watches
	mu      struct {
		sync.Mutex
		closed bool
	}
	stop chan struct{} // closed by close
	wg   sync.WaitGroup
}

func newTopicWatch() *topicWatch { return &topicWatch{stop: make(chan struct{})} }

// open starts a stream of filter for a viewer at remote that may see what
// canRead allows (nil: every topic). The caller must call done(v) when it
// ends, and end it when v.replaced is closed.
func (w *topicWatch) open(filter, remote string, canRead func(string) bool, now time.Time) (*topicViewer, error) {
	if err := validViewFilter(filter); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.closed {
		return nil, errWatchClosed
	}
	var cur []*topicViewer
	if p := w.viewers.Load(); p != nil {
		cur = *p
	}
	if len(cur) >= maxTopicViewers {
		cur = replaceOne(cur)
	}
	v := &topicViewer{filter: filter, levels: strings.Split(filter, "/"), ch: make(chan adminapi.TopicEvent, topicBuffer),
		addr: hostOf(remote), canRead: canRead, replaced: make(chan struct{})}
	v.mu.tokens, v.mu.last = topicRate, now
	next := append(append(make([]*topicViewer, 0, len(cur)+1), cur...), v)
	w.viewers.Store(&next)
	w.wg.Add(1)
	return v, nil
}

// replaceOne tells the oldest stream of the address that holds the most
// streams (ties: the one whose oldest stream is oldest) to end, and returns
// the others, in order.
func replaceOne(cur []*topicViewer) []*topicViewer {
	count := map[string]int{}
	for _, v := range cur {
		count[v.addr]++
	}
	victim := -1
	for i, v := range cur { // oldest first
		if victim < 0 || count[v.addr] > count[cur[victim].addr] {
			victim = i
		}
	}
	close(cur[victim].replaced)
	return append(append(make([]*topicViewer, 0, len(cur)-1), cur[:victim]...), cur[victim+1:]...)
}

// hostOf is the host part of a RemoteAddr.
func hostOf(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// done ends v's stream.
func (w *topicWatch) done(v *topicViewer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var next []*topicViewer
	if p := w.viewers.Load(); p != nil {
		for _, o := range *p {
			if o != v {
				next = append(next, o)
			}
		}
	}
	w.viewers.Store(&next)
	w.wg.Done()
}

// close refuses new streams, tells open ones to end and waits until they have.
func (w *topicWatch) close() {
	w.mu.Lock()
	if !w.mu.closed {
		w.mu.closed = true
		close(w.stop)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

// watching reports whether a stream is open.
func (w *topicWatch) watching() bool {
	p := w.viewers.Load()
	return p != nil && len(*p) > 0
}

// publish shows a publish to the viewers whose filter matches its topic.
func (w *topicWatch) publish(topic string, qos byte, retain bool, payload []byte, now time.Time) {
	p := w.viewers.Load()
	if p == nil || len(*p) == 0 {
		return
	}
	for _, v := range *p {
		if !topicMatch(v.levels, topic) {
			continue
		}
		if !v.take(now) { // the rate first: an ACL check costs more than a token
			v.skipped.Add(1)
			continue
		}
		if v.canRead != nil && !v.canRead(topic) {
			continue
		}
		v.offer(topicEvent(topic, qos, retain, payload, now))
	}
}

// topicEvent copies what a viewer sees of a message (strings.Clone: a
// packet's topic is a view into its buffer).
func topicEvent(topic string, qos byte, retain bool, payload []byte, now time.Time) adminapi.TopicEvent {
	ev := adminapi.TopicEvent{Topic: strings.Clone(topic), QoS: qos, Retain: retain, PayloadSize: len(payload), At: now}
	ev.Payload, ev.PayloadEncoding, ev.Truncated = previewPayload(payload)
	return ev
}

// validViewFilter reports what is wrong with a filter to watch, if anything.
func validViewFilter(filter string) error {
	if err := share.ValidFilter(filter); err != nil {
		return fmt.Errorf("query parameter \"filter\": %v", err)
	}
	if share.IsShared(filter) {
		return fmt.Errorf("query parameter \"filter\": %q is a shared subscription; watch its topic filter instead (a viewer never joins a group)", filter)
	}
	return nil
}

// topicMatch reports whether topic matches the filter split into levels, by
// MQTT's rules: '+' is one level, a final '#' is any number (zero included),
// and a topic starting with '$' is not matched by a wildcard first level.
func topicMatch(levels []string, topic string) bool {
	if strings.HasPrefix(topic, "$") && (levels[0] == "+" || levels[0] == "#") {
		return false
	}
	for i, l := range levels {
		if l == "#" {
			return true
		}
		level, rest, more := strings.Cut(topic, "/")
		if l != "+" && l != level {
			return false
		}
		if !more {
			// The topic ends here: it matches if the filter does too, or
			// continues with a final '#' alone ("a/#" matches "a").
			return i == len(levels)-1 || (i == len(levels)-2 && levels[i+1] == "#")
		}
		topic = rest
	}
	return false // the topic has more levels than the filter
}

// previewPayload returns at most adminapi.MaxPreviewBytes of p as text when
// they are valid UTF-8, else base64, and whether it cut p short.
func previewPayload(p []byte) (payload, encoding string, truncated bool) {
	if len(p) > adminapi.MaxPreviewBytes {
		p, truncated = p[:adminapi.MaxPreviewBytes], true
		if utf8.Valid(p[:max(len(p)-utf8.UTFMax, 0)]) {
			// Do not call text binary because the cut split a character.
			for !utf8.Valid(p) && len(p) > 0 {
				p = p[:len(p)-1]
			}
		}
	}
	if utf8.Valid(p) {
		return string(p), "utf-8", truncated
	}
	return base64.StdEncoding.EncodeToString(p), "base64", truncated
}
