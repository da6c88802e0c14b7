package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// GET /api/v1/topics/stream?filter=: server-sent events of the messages
// published on a topic filter (see topicwatch.go for the bounds). Events:
//
//	event: message  data: adminapi.TopicEvent (JSON)
//	event: stats    data: adminapi.TopicStreamStats (JSON), every statsEvery
//	event: closed   data: adminapi.Error (JSON): a newer stream took this one's place
//
// Matching retained messages come first (at most maxTopicRetained), flagged retain.

const (
	statsEvery        = 5 * time.Second
	streamWriteBudget = 5 * time.Second // a viewer that reads nothing for this long is dropped (and shutdown waits no longer)
)

func (b *Service) handleTopicStream(w http.ResponseWriter, r *http.Request) {
	q, err := queryParams(r, "filter")
	if err != nil {
		badRequest(w, err)
		return
	}
	filter := q.Get("filter")
	if filter == "" {
		badRequest(w, errors.New(`missing query parameter "filter" (a topic filter, URL-encoded, e.g. filter=sensors%2F%23)`))
		return
	}
	var canRead func(string) bool
	if b.cfg.TopicReader != nil {
		canRead, err = b.cfg.TopicReader()
	}
	if err != nil {
		writeJSON(w, http.StatusForbidden, adminapi.Error{Error: err.Error()})
		return
	}
	v, err := b.obs.topics.open(filter, r.RemoteAddr, canRead, time.Now())
	switch {
	case errors.Is(err, errWatchClosed):
		writeJSON(w, http.StatusServiceUnavailable, adminapi.Error{Error: err.Error()})
		return
	case err != nil:
		badRequest(w, err)
		return
	}
	defer b.obs.topics.done(v)
	b.log.Info("topic stream opened", "filter", filter, "remote", r.RemoteAddr)

	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	send := func(event string, data any) error {
		js, err := json.Marshal(data) // escapes <, > and &; never contains a newline
		if err != nil {
			return err
		}
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteBudget))
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, js); err != nil {
			return err
		}
		return rc.Flush()
	}
	stats := func() adminapi.TopicStreamStats {
		return adminapi.TopicStreamStats{Filter: filter, Sent: v.sent.Load(), Skipped: v.skipped.Load(), RatePerSec: topicRate}
	}
	err = send("stats", stats())
	for i, m := range b.b.Retained(filter) {
		if err != nil {
			break
		}
		if !topicMatch(v.levels, m.Topic) || (canRead != nil && !canRead(m.Topic)) {
			continue // mochi's retained index and MQTT may differ on '$' topics
		}
		if i >= maxTopicRetained || !v.take(time.Now()) {
			v.skipped.Add(1)
			continue
		}
		err = send("message", topicEvent(m.Topic, m.QoS, true, m.Payload, time.Now()))
		if err == nil {
			v.sent.Add(1)
		}
	}
	tick := time.NewTicker(statsEvery)
	defer tick.Stop()
	for err == nil {
		select {
		case ev := <-v.ch:
			if err = send("message", ev); err == nil {
				v.sent.Add(1)
			}
		case <-tick.C:
			err = send("stats", stats())
		case <-r.Context().Done():
			err = r.Context().Err()
		case <-b.obs.topics.stop:
			err = errWatchClosed
		case <-v.replaced:
			err = errReplaced
			_ = send("closed", adminapi.Error{Error: err.Error()})
		}
	}
	b.log.Info("topic stream closed", "filter", filter, "sent", v.sent.Load(), "skipped", v.skipped.Load(), "remote", r.RemoteAddr, "error", err)
}
