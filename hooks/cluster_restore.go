package hooks

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// Step 4 of the ownership protocol (cluster_sessions.go): a persistent
// session this node did not hold is rebuilt from its record.

// restore rebuilds a persistent session from its record: interest, then
// the replay of its queued messages into its outbox (Outboxes), then a
// placeholder client with its subscriptions, which mochi resumes the
// session from (session present).
func (o *sessionOwner) restore(ctx context.Context, cl *mqtt.Client, s *clusterSession, rec *sessionstore.Record) {
	st := &sessionstate.State{}
	if len(rec.State) > 0 {
		var err error
		if st, err = sessionstate.DecodeCluster(cl.ID, rec.State); err != nil {
			o.log().Error("cluster: unreadable session record; starting the session empty", "client", cl.ID, "error", err)
			st = &sessionstate.State{}
		}
	}
	if old, ok := o.server.Clients.Get(cl.ID); ok {
		o.dropLocal(old) // a stale local copy
	}
	// Shared subscriptions go back into mochi's index and the session's
	// subscriptions, from which Key-Shared rejoins their groups
	// (KeyShared.OnSessionEstablished, with their key filters): a group has
	// its own log, not the node's interest or the session's queue.
	filters := make([]string, 0, len(st.Subs))
	plain := make([]sessionstate.Sub, 0, len(st.Subs))
	s.mu.Lock()
	for _, sub := range st.Subs {
		s.subs[sub.Filter] = sub
		if mqtt.IsSharedFilter(sub.Filter) {
			continue
		}
		s.setSinceLocked(sub.Filter, sub.Since)
		filters = append(filters, sub.Filter)
		plain = append(plain, sub)
	}
	for f, kf := range st.KeyFilters {
		if _, ok := s.subs[f]; ok {
			s.kf[f] = kf
		}
	}
	s.mu.Unlock()
	o.interest.add(ctx, s, filters...)
	version := cl.Properties.ProtocolVersion
	// The session takes live deliveries before its queued messages are read
	// back: a message stored after the replay's end must reach it here (a
	// local publish is delivered from mochi's index, never by this node's
	// consumer). Its outbox starts empty, then its subscriptions go into
	// mochi's index, then the replay's messages go ahead of what arrived
	// meanwhile (found by TestClusterRollingRestart: subscribing after the
	// replay lost what the node's own clients published in between).
	outboxes := o.outboxes()
	if outboxes != nil {
		outboxes.RequeueSession(cl.ID, version, nil)
	}
	ph := o.server.NewClient(nil, cl.Net.Listener, cl.ID, false)
	ph.Properties.ProtocolVersion = cl.Properties.ProtocolVersion
	ph.Properties.Username = cl.Properties.Username
	ph.Properties.Clean = false
	ph.Stop(packets.ErrSessionTakenOver)
	for _, sub := range st.Subs {
		ps := packets.Subscription{
			Filter: sub.Filter, Qos: sub.Qos, NoLocal: sub.NoLocal, RetainAsPublished: sub.RetainAsPublished,
			RetainHandling: sub.RetainHandling, Identifier: sub.Identifier,
		}
		if o.server.Topics.Subscribe(cl.ID, ps) {
			atomic.AddInt64(&o.server.Info.Subscriptions, 1)
		}
		ph.State.Subscriptions.Add(sub.Filter, ps)
	}
	o.server.Clients.Add(ph)
	if outboxes != nil {
		outboxes.RoutesChanged()
	}

	acked := map[uint64]bool{}
	for _, a := range rec.Acked {
		acked[a] = true
	}
	// The session's queued messages, in KL_MSGS order, go to its outbox:
	// the fan-out sends them once the client's CONNACK is out, in that
	// order, as single-node mode resends what it kept.
	var queued []outbox.Queued
	maxHeld := int(o.server.Options.Capabilities.MaximumInflight)
	handled := rec.Floor // every message up to here is queued or not for the session
	last, err := o.node.Replay(ctx, filters, rec.Floor, func(seq uint64, body []byte) {
		defer func() { handled = seq }()
		if acked[seq] {
			return
		}
		pk, err := decodeEnvelope(body)
		if err != nil || !remainingExpiry(&pk, time.Now()) {
			return
		}
		qos, ids, ok := matchSession(plain, pk.TopicName, seq)
		if !ok || min(qos, pk.FixedHeader.Qos) == 0 {
			return
		}
		if len(queued) >= maxHeld {
			atomic.AddInt64(&o.server.Info.InflightDropped, 1)
			return
		}
		if version != 5 {
			ids = nil
		}
		p, err := encodeFrame(pk, version, false, min(qos, pk.FixedHeader.Qos), ids)
		if err != nil {
			o.log().Warn("cluster: a queued message cannot be encoded for the session; skipped", "client", cl.ID, "topic", clip(pk.TopicName), "error", err)
			return
		}
		// It may have reached the client from the node that held the
		// session before: DUP on its first send here.
		queued = append(queued, outbox.Queued{Pub: p, Ref: seq, Created: pk.Created, Deadline: pk.Expiry, Sent: true})
	})
	if err != nil {
		o.log().Error("cluster: replaying a session's queued messages failed; the rest stay in its record for the next replay", "client", cl.ID, "after", handled, "error", err)
	}
	s.replayedTo.Store(last)
	if outboxes != nil {
		o.stats.Restored.Add(uint64(outboxes.PrependSession(cl.ID, queued, last)))
	}
	s.mu.Lock()
	if err == nil {
		s.capped = false // what the replay queued holds the floor now
	} else {
		s.floorCap = handled
	}
	s.mu.Unlock()
}

// sincePending marks a filter whose start is not known yet: it takes no
// queued message until it is.
const sincePending = math.MaxUint64

func (s *clusterSession) setSinceLocked(filter string, since uint64) {
	s.since[filter] = since
	s.maxSince = 0
	for _, v := range s.since {
		s.maxSince = max(s.maxSince, v)
	}
}
