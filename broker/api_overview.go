package broker

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/keyshared"
)

// GET /api/v1/overview, /api/v1/groups/activity and /api/v1/groups/messages.

func (b *Broker) handleOverview(w http.ResponseWriter, r *http.Request) {
	if _, err := queryParams(r); err != nil {
		badRequest(w, err)
		return
	}
	writeJSON(w, http.StatusOK, b.overview())
}

// overview gathers the broker's figures: mochi's counters, the connection
// layer's, the groups' stored totals, the data file's size and the sampler's
// history.
func (b *Broker) overview() adminapi.OverviewView {
	i := b.server.Info
	load := func(p *int64) int64 { return atomic.LoadInt64(p) }
	v := adminapi.OverviewView{
		StartedAt: b.started, UptimeSeconds: time.Since(b.started).Seconds(),
		ClientsConnected: load(&i.ClientsConnected), ClientsMaximum: load(&i.ClientsMaximum),
		Subscriptions: load(&i.Subscriptions), Retained: int64(b.server.Topics.Retained.Len()),
		InflightMessages: load(&i.Inflight),
		MessagesReceived: uint64(load(&i.MessagesReceived)), MessagesSent: uint64(load(&i.MessagesSent)),
		MessagesDropped: uint64(load(&i.MessagesDropped)), InflightDropped: uint64(load(&i.InflightDropped)),
		BytesReceived: uint64(load(&i.BytesReceived)), BytesSent: uint64(load(&i.BytesSent)),
		DataFile: b.db.Path(), SampleSeconds: sampleEvery.Seconds(),
	}
	v.ClientsDisconnected = max(int64(b.server.Clients.Len())-v.ClientsConnected, 0)
	if cs := b.connStats; cs != nil {
		v.SlowDisconnects = cs.SlowDisconnects.Load()
	}
	for _, cv := range b.ClientViews() {
		v.QueuedBytes += int64(cv.QueuedBytes)
	}
	if infos, err := b.keyShared.Store().Groups(); err == nil {
		v.Groups = len(infos)
		for _, gi := range infos {
			v.GroupBacklog += gi.Backlog
			v.DeadLetters += gi.DeadLetters
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
	if _, err := a.b.keyShared.Store().Group(name); err != nil {
		return adminapi.GroupActivityView{}, a.statusError(err, name, 0)
	}
	a.b.obs.samples.watch(name, time.Now())
	return adminapi.GroupActivityView{Group: name, SampleSeconds: sampleEvery.Seconds(), History: a.b.obs.samples.groupHistory(name)}, nil
}

// sampleRates records every group's counters in the rate tracker (as
// groupView does when it looks), so rates are there at the first look.
func (a *groupAdmin) sampleRates(now time.Time) {
	sts, err := a.b.keyShared.Groups()
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
	limit, given, err := uintParam(q, "limit")
	if err != nil {
		badRequest(w, err)
		return
	}
	if !given {
		limit = adminapi.DefaultGroupMessages
	} else if limit < 1 || limit > adminapi.MaxGroupMessages {
		badRequest(w, fmt.Errorf("query parameter \"limit\": %d is not between 1 and %d", limit, adminapi.MaxGroupMessages))
		return
	}
	v, err := a.groupMessages(name, int(limit))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// groupMessages reads up to limit messages of the group's log after its
// cursor and marks those a member holds in flight.
func (a *groupAdmin) groupMessages(name string, limit int) (adminapi.GroupMessagesView, error) {
	ks := a.b.keyShared
	st, err := ks.Group(name)
	if err != nil {
		return adminapi.GroupMessagesView{}, a.statusError(err, name, 0)
	}
	log, err := ks.Store().Log(name)
	if err != nil {
		return adminapi.GroupMessagesView{}, a.statusError(err, name, 0)
	}
	v := adminapi.GroupMessagesView{Group: name, Cursor: st.Info.Cursor, Head: max(st.Info.Head, st.Stats.Head), Messages: []adminapi.PendingMessageView{}}
	if st.Running {
		v.Cursor = max(v.Cursor, st.Stats.Cursor)
	}
	msgs, err := log.ReadFrom(v.Cursor+1, limit+1, nil)
	if err != nil {
		return adminapi.GroupMessagesView{}, a.statusError(err, name, 0)
	}
	if len(msgs) > limit {
		msgs, v.More = msgs[:limit], true
	}
	held := a.heldByMembers(name)
	members := len(ks.Members(name))
	for _, m := range msgs {
		p := adminapi.PendingMessageView{
			Offset: m.Offset, Key: m.Key, Topic: m.Topic, QoS: m.QoS, PayloadSize: len(m.Payload),
			PublishedAt: m.PublishedAt, ExpiresAt: m.ExpiresAt,
		}
		p.Payload, p.PayloadEncoding, p.Truncated = previewPayload(m.Payload)
		v.Messages = append(v.Messages, p)
	}
	markStates(v.Messages, msgs, held, members)
	return v, nil
}

// markStates sets the State of each listed message from the deliveries the
// members hold. A key has at most one message in flight and it is the key's
// oldest unresolved one (invariants 1 and 2): the key's messages before it are
// resolved, those after it wait. A key whose held delivery is not listed has
// it further on, so its listed messages are resolved. Of a key with no held
// delivery nothing is known, unless the group has no member: then all wait.
func markStates(views []adminapi.PendingMessageView, msgs []keyshared.Message, held map[string][]heldMessage, members int) {
	inFlight := map[string]int{} // key -> index of its message in flight in msgs
	for i, m := range msgs {
		if _, done := inFlight[m.Key]; done {
			continue
		}
		for _, h := range held[m.Key] {
			if h.topic == m.Topic && bytes.Equal(h.payload, m.Payload) {
				inFlight[m.Key] = i
				views[i].State, views[i].InFlightTo = adminapi.MessageInFlight, h.member
				break
			}
		}
	}
	for i, m := range msgs {
		j, ok := inFlight[m.Key]
		switch {
		case ok && i < j, !ok && len(held[m.Key]) > 0:
			views[i].State = adminapi.MessageResolved
		case ok && i > j, !ok && members == 0:
			views[i].State = adminapi.MessageWaiting
		}
	}
}

// heldMessage is a Key-Shared delivery in a member's session.
type heldMessage struct {
	member, topic string
	payload       []byte
}

// heldByMembers returns, by routing key, the group's deliveries the members'
// sessions hold unacknowledged. A member of several groups may hold messages
// of the others too; matching topic and payload tells them apart well enough.
func (a *groupAdmin) heldByMembers(group string) map[string][]heldMessage {
	ks := a.b.keyShared
	out := map[string][]heldMessage{}
	for _, id := range ks.Members(group) {
		cl, ok := a.b.server.Clients.Get(id)
		if !ok {
			continue
		}
		for _, pk := range cl.State.Inflight.GetAll(false) {
			if pk.FixedHeader.Type != packets.Publish || !ks.Owns(id, pk.PacketID) {
				continue
			}
			key := routingKey(&pk, a.b.cfg.KeyProperty)
			out[key] = append(out[key], heldMessage{member: id, topic: pk.TopicName, payload: pk.Payload})
		}
	}
	return out
}

// routingKey is a packet's Key-Shared routing key: the user property named
// keyProperty, else the topic.
func routingKey(pk *packets.Packet, keyProperty string) string {
	for _, u := range pk.Properties.User {
		if u.Key == keyProperty {
			return u.Val
		}
	}
	return pk.TopicName
}
