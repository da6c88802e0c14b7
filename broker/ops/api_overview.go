package ops

import (
	"context"
	"net/http"
	"os"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// GET /api/v1/overview, /api/v1/groups/activity and /api/v1/groups/messages.

func (b *Service) handleOverview(w http.ResponseWriter, r *http.Request) {
	if _, err := queryParams(r); err != nil {
		badRequest(w, err)
		return
	}
	writeJSON(w, http.StatusOK, b.overview())
}

// overview gathers the broker's figures: mochi's counters, the connection
// layer's, the groups' stored totals, the data file's size and the sampler's
// history.
func (b *Service) overview() adminapi.OverviewView {
	f := b.b.Figures()
	v := adminapi.OverviewView{
		StartedAt: b.started, UptimeSeconds: time.Since(b.started).Seconds(),
		ClientsConnected: f.ClientsConnected, ClientsMaximum: f.ClientsMaximum,
		Subscriptions: f.Subscriptions, Retained: f.Retained,
		InflightMessages: f.Inflight,
		MessagesReceived: uint64(f.MessagesReceived), MessagesSent: uint64(f.MessagesSent),
		MessagesDropped: uint64(f.MessagesDropped), InflightDropped: uint64(f.InflightDropped),
		BytesReceived: uint64(f.BytesReceived), BytesSent: uint64(f.BytesSent),
		DataFile: f.DataFile, SampleSeconds: sampleEvery.Seconds(),
	}
	v.ClientsDisconnected = max(f.Sessions-v.ClientsConnected, 0)
	v.SlowDisconnects = f.ConnSlowDisconnects
	for _, cv := range b.b.Clients() {
		v.QueuedBytes += int64(cv.QueuedBytes)
	}
	if sts, err := b.groups.groups.Groups(); err == nil {
		v.Groups = len(sts)
		for _, st := range sts {
			v.GroupBacklog += st.Info.Backlog
			v.DeadLetters += st.Info.DeadLetters
		}
	}
	if fi, err := os.Stat(v.DataFile); err == nil {
		v.DataFileBytes = fi.Size()
	}
	v.History, v.Rates = b.obs.samples.overview()
	return v
}

func (a *groupAdmin) handleGroupActivity(w http.ResponseWriter, r *http.Request) {
	name, err := groupTarget(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	v, err := a.groupActivity(name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// groupActivity returns a group's sampled history and keeps it sampled for a while.
func (a *groupAdmin) groupActivity(name string) (adminapi.GroupActivityView, error) {
	if _, err := a.groups.Group(name); err != nil {
		return adminapi.GroupActivityView{}, a.statusError(err, name, 0)
	}
	a.s.obs.samples.watch(name, time.Now())
	return adminapi.GroupActivityView{Group: name, SampleSeconds: sampleEvery.Seconds(), History: a.s.obs.samples.groupHistory(name)}, nil
}

// sampleRates records every group's counters in the rate tracker (as
// groupView does when it looks), so rates are there at the first look.
func (a *groupAdmin) sampleRates(now time.Time) {
	sts, err := a.groups.Groups()
	if err != nil {
		return
	}
	names := make(map[string]bool, len(sts))
	for _, st := range sts {
		s := rateSample{at: now, head: max(st.Info.Head, st.Stats.Head)}
		if st.Running {
			s.delivered, s.acked, s.dead = st.Stats.Delivered, st.Stats.Acked, st.Stats.DeadLettered
		}
		a.rates.observe(st.Info.Name, s)
		names[st.Info.Name] = true
	}
	a.rates.retain(names)
}

func (a *groupAdmin) handleGroupMessages(w http.ResponseWriter, r *http.Request) {
	q, err := queryParams(r, "group", "limit")
	if err != nil {
		badRequest(w, err)
		return
	}
	name, err := groupParam(q)
	if err != nil {
		badRequest(w, err)
		return
	}
	limit, err := limitParam(q, adminapi.DefaultGroupMessages, adminapi.MaxGroupMessages)
	if err != nil {
		badRequest(w, err)
		return
	}
	v, err := a.groupMessages(r.Context(), name, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// groupMessages reads up to limit messages of the group's log after its
// cursor, each with the state the dispatcher gives it.
func (a *groupAdmin) groupMessages(ctx context.Context, name string, limit int) (adminapi.GroupMessagesView, error) {
	st, msgs, more, err := a.groups.Pending(ctx, name, limit)
	if err != nil {
		return adminapi.GroupMessagesView{}, a.statusError(err, name, 0)
	}
	v := adminapi.GroupMessagesView{Group: name, Cursor: st.Info.Cursor, Head: max(st.Info.Head, st.Stats.Head), More: more, Messages: []adminapi.PendingMessageView{}}
	if st.Running {
		v.Cursor = max(v.Cursor, st.Stats.Cursor)
	}
	for _, m := range msgs {
		p := adminapi.PendingMessageView{
			Offset: m.Offset, Key: m.Key, Topic: m.Topic, QoS: m.QoS, PayloadSize: len(m.Payload),
			PublishedAt: m.PublishedAt, ExpiresAt: m.ExpiresAt,
			State: m.Status.State.String(), InFlightTo: m.Status.Holder, Attempts: m.Status.Attempts,
		}
		p.Payload, p.PayloadEncoding, p.Truncated = previewPayload(m.Payload)
		v.Messages = append(v.Messages, p)
	}
	return v, nil
}
