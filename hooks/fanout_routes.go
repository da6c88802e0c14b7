package hooks

import (
	"slices"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
)

// route is one subscriber of a topic, as the fast path caches it: the
// session (never a mochi Client, so that a cached route does not keep a
// closed connection alive) and what the pubDelivery needs of its subscription.
type route struct {
	s                 *fanSession
	qos               byte // granted QoS
	noLocal           bool
	retainAsPublished bool
	ids               []int // MQTT 5 subscription identifiers, sorted
}

func routeOf(s *fanSession, version byte, sub packets.Subscription) route {
	return route{s: s, qos: sub.Qos, noLocal: sub.NoLocal, retainAsPublished: sub.RetainAsPublished, ids: sortedIDs(version, sub)}
}

func sortedIDs(version byte, sub packets.Subscription) []int {
	if version != 5 || len(sub.Identifiers) == 0 {
		return nil
	}
	ids := make([]int, 0, len(sub.Identifiers))
	for _, i := range sub.Identifiers {
		if i > 0 {
			ids = append(ids, i)
		}
	}
	slices.Sort(ids)
	return ids
}

// routes is the subscribers of one topic, derived from mochi's topic index
// and valid while the index has not changed since (version).
type routes struct {
	version uint64
	// mochiOnly: something only mochi can deliver matches (an inline
	// subscription, or a shared one nobody else takes).
	mochiOnly bool
	maxQoS    byte // the highest granted QoS among subs
	subs      []route
}

// Bounds of the route cache: topics, and bytes of topics and routes (a
// wildcard subscriber appears under every topic it matches); past either the
// cache starts over. A route holds a session, which holds no connection once
// the client is gone and nothing at all once the session ended.
const (
	maxCachedRoutes     = 256 << 10
	maxCachedRouteBytes = 64 << 20
	routeCost           = 48 // one route, besides its subscription identifiers
)

// invalidate marks every cached route stale: mochi's topic index changed.
func (h *Fanout) invalidate() { h.routesVersion.Add(1) }

// routesFor returns topic's subscribers, scanning mochi's index only when
// it changed since the last scan of this topic.
func (h *Fanout) routesFor(topic string) *routes {
	v := h.routesVersion.Load()
	if r, ok := h.routes.get(topic, v); ok {
		return r
	}
	subs := h.server.Topics.Subscribers(topic)
	delete(subs.Shared, placeholderFilter)
	r := &routes{version: v, mochiOnly: len(subs.InlineSubscriptions) > 0 || (len(subs.Shared) > 0 && !h.sharedElsewhere)}
	for id, sub := range subs.Subscriptions {
		cl, ok := h.server.Clients.Get(id)
		if !ok || cl.Net.Inline {
			continue
		}
		if h.canRead != nil && !h.canRead(cl, topic) {
			continue // the ACL is fixed for the broker's life, and so is this client
		}
		r.subs = append(r.subs, routeOf(h.sessions.ensure(cl), cl.Properties.ProtocolVersion, sub))
		r.maxQoS = max(r.maxQoS, sub.Qos)
	}
	cost := int64(len(r.subs)) * routeCost
	for _, rt := range r.subs {
		cost += int64(8 * len(rt.ids))
	}
	h.routes.put(topic, v, r, cost)
	return r
}

// OnPublish delivers a publish from the cached routes and tells mochi to
// skip routing it (mochi's own routing rebuilds the subscriber set on every
// publish). Retained publishes go mochi's way (it stores them), and so do
// those an inline or unclaimed shared subscription matches; their client
// deliveries come back through OnSelectSubscribers. QoS 0 publishes of the
// server's inline clients (messages from other nodes) take the cached
// routes too: they were 35-40% of a cluster node's CPU on mochi's path (its
// index scan builds maps per publish). Their QoS 1/2 publishes stay on
// mochi's path, where the other hooks' OnSelectSubscribers choose among the
// sessions (the cluster's keeps a queued message from a session that got it
// by a replay already, or whose subscription is younger than it).
func (h *Fanout) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Retain || (cl.Net.Inline && pk.FixedHeader.Qos > 0) {
		return pk, nil
	}
	r := h.routesFor(pk.TopicName)
	if r.mochiOnly {
		return pk, nil
	}
	if len(r.subs) == 0 {
		// Nobody here subscribed (an idle device's telemetry with its
		// readers elsewhere): no delivery to build. It was 9% of the CPU in
		// the profile of 5,000 devices publishing every 20 s, its
		// 900-byte pubDelivery most of the garbage per publish.
		h.Stats.FastPath.Add(1)
		return pk, packets.CodeSuccessIgnore // routed: mochi acknowledges and stops
	}
	d := h.newPublishDelivery(pk)
	if q, ok := cl.Net.Conn.(*connq.Conn); ok {
		d.round = q.Round()
	}
	if pk.FixedHeader.Qos > 0 {
		d.stores = &storeWait{}
	}
	for _, rt := range r.subs {
		d.to(rt)
	}
	h.Stats.FastPath.Add(1)
	if d.stores != nil && d.stores.writes > 0 {
		if err := h.awaitStored(cl, pk, d.stores); err != nil {
			return pk, err
		}
	}
	return pk, packets.CodeSuccessIgnore // routed: mochi acknowledges and stops
}

// awaitStored makes the publisher's acknowledgement wait until the records
// the publish added to persistent sessions are durable: held in its
// connection's queue (mochi goes on reading), or, without one, waited for
// here. If one could not be stored the publish is refused: MQTT 5 with
// 0x80, MQTT 3.1.1 by closing the connection (it cannot refuse a publish).
func (h *Fanout) awaitStored(cl *mqtt.Client, pk packets.Packet, w *storeWait) error {
	typ := packets.Puback
	if pk.FixedHeader.Qos == 2 {
		typ = packets.Pubrec
	}
	v5 := cl.Properties.ProtocolVersion == 5
	if q := queueOf(cl); q != nil {
		hold := q.HoldAck(typ, pk.PacketID, v5)
		w.seal(func(err error) {
			if err != nil {
				h.Stats.StoreRefused.Add(1)
				h.Log.Error("fanout: a message for a persistent session was not stored; its publish is refused", "client", clip(cl.ID), "topic", clip(pk.TopicName), "error", err)
				hold.Fail(packets.ErrUnspecifiedError.Code)
				return
			}
			hold.Release()
		})
		return nil
	}
	ch := make(chan error, 1)
	w.seal(func(err error) { ch <- err })
	err := <-ch
	if err == nil {
		return nil
	}
	h.Stats.StoreRefused.Add(1)
	h.Log.Error("fanout: a message for a persistent session was not stored; its publish is refused", "client", clip(cl.ID), "topic", clip(pk.TopicName), "error", err)
	if v5 {
		_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: pk.PacketID, ReasonCode: packets.ErrUnspecifiedError.Code})
	} else {
		cl.Stop(err)
	}
	return packets.ErrRejectPacket
}

// OnSelectSubscribers delivers what mochi routes itself (retained
// publishes, wills, $SYS, publishes an inline subscription matches or an
// inline client makes) to client sessions, and leaves mochi only the
// inline subscriptions.
func (h *Fanout) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	delete(subs.Shared, placeholderFilter)
	if len(subs.Shared) > 0 {
		// Choose shared members now and merge them into Subscriptions, so that
		// a client with both kinds of subscription gets one copy; then leave
		// mochi a selection naming nobody so it merges nothing back.
		subs.SelectShared()
		subs.MergeSharedSelected()
		subs.SharedSelected = map[string]packets.Subscription{placeholderClient: {}}
	}
	d := h.newPublishDelivery(pk)
	for id, sub := range subs.Subscriptions {
		cl, ok := h.server.Clients.Get(id)
		if ok && cl.Net.Inline {
			continue
		}
		delete(subs.Subscriptions, id)
		if !ok || (h.canRead != nil && !h.canRead(cl, pk.TopicName)) {
			continue
		}
		d.to(routeOf(h.sessions.ensure(cl), cl.Properties.ProtocolVersion, sub))
	}
	return subs
}
