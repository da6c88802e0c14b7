package hooks

import (
	"slices"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
)

// The placeholder shared subscription makes mochi call OnSelectSubscribers
// for every publish (it only does when a shared subscription matches).
const (
	placeholderClient = "\x00keyline-fanout"
	placeholderFilter = "$share/keyline.fanout/#"
)

// FanoutStats are the fan-out hook's counters.
type FanoutStats struct {
	Deliveries atomic.Uint64 // QoS 0 frames queued for a connection
	Encodes    atomic.Uint64 // frames encoded (one per publish and variant)
	TooLarge   atomic.Uint64 // deliveries skipped: above the client's maximum packet size
	FastPath   atomic.Uint64 // publishes routed from the cached routes, never seen by mochi's router
}

// Fanout takes QoS 0 deliveries to ordinary subscriptions over from mochi.
// Each publish is encoded once per frame variant (protocol version, retain
// flag, subscription identifiers) and queued by reference on every matching
// connection's connq.Conn; a connection whose subscriptions overlap gets one
// copy. Deliveries at QoS 1 or 2, to inline subscriptions, and to clients not
// behind a connq.Conn stay with mochi.
type Fanout struct {
	mqtt.HookBase
	server *mqtt.Server
	// canRead reports whether a client may receive messages on a topic; nil allows all.
	canRead func(cl *mqtt.Client, topic string) bool
	// limits gives a client's queue limits once its id is known.
	limits func(cl *mqtt.Client) connq.Limits
	// SharedElsewhere says another hook delivers $share subscriptions (Key-Shared),
	// so they do not keep a publish on mochi's path.
	SharedElsewhere bool
	Stats           FanoutStats

	routes        *topicCache[*routes]
	routesVersion atomic.Uint64 // bumped whenever mochi's topic index may have changed
}

// NewFanout returns a fan-out hook for server. canRead (nil: allow all)
// applies the broker's ACL to each delivery, as mochi does; limits (nil: keep
// the listener's) sets each connection's queue limits when its session starts.
func NewFanout(server *mqtt.Server, canRead func(cl *mqtt.Client, topic string) bool, limits func(cl *mqtt.Client) connq.Limits) *Fanout {
	return &Fanout{server: server, canRead: canRead, limits: limits,
		routes: newTopicCache[*routes](maxCachedRoutes, maxCachedRouteBytes)}
}

// ID returns the hook's id.
func (h *Fanout) ID() string { return "keyline-fanout" }

// Provides reports which hook methods Fanout implements.
func (h *Fanout) Provides(b byte) bool { return fanoutEvents.has(b) }

var fanoutEvents = eventSet(
	mqtt.OnSelectSubscribers, mqtt.OnSessionEstablish, mqtt.OnPublish,
	mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.OnSessionEstablished, mqtt.OnStarted, mqtt.OnClientExpired,
	mqtt.OnPacketEncode,
)

// OnSessionEstablish applies the queue limits that match the client's id.
func (h *Fanout) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if q, ok := cl.Net.Conn.(*connq.Conn); ok && h.limits != nil {
		q.SetLimits(h.limits(cl))
	}
}

// Init registers the placeholder shared subscription.
func (h *Fanout) Init(any) error {
	h.server.Topics.Subscribe(placeholderClient, packets.Subscription{Filter: placeholderFilter})
	return nil
}

type variant struct {
	version byte
	retain  bool
	ids     []int
	frame   []byte
}

// OnSelectSubscribers delivers the QoS 0 part of a publish that mochi
// routes itself (retained publishes, QoS 1/2 subscribers, $SYS) and leaves
// the rest of subs to mochi.
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
	var variants []variant
	for id, sub := range subs.Subscriptions {
		if min(pk.FixedHeader.Qos, sub.Qos) > 0 {
			continue // mochi tracks QoS 1/2 deliveries
		}
		cl, ok := h.server.Clients.Get(id)
		if !ok {
			continue
		}
		q, ok := cl.Net.Conn.(*connq.Conn)
		if !ok {
			continue
		}
		delete(subs.Subscriptions, id)
		if h.canRead != nil && !h.canRead(cl, pk.TopicName) {
			continue
		}
		h.deliver(&variants, pk, route{cl: cl, q: q, sub: sub, ids: sortedIDs(cl, sub)})
	}
	return subs
}

// route is one subscriber of a topic, as the fast path caches it.
type route struct {
	cl  *mqtt.Client
	q   *connq.Conn // nil: not a live connection (an offline session)
	sub packets.Subscription
	ids []int // MQTT 5 subscription identifiers, sorted
}

func sortedIDs(cl *mqtt.Client, sub packets.Subscription) []int {
	if cl.Properties.ProtocolVersion != 5 || len(sub.Identifiers) == 0 {
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

// deliver queues pk at QoS 0 for one subscriber, applying no-local,
// retain-as-published and the client's maximum packet size.
func (h *Fanout) deliver(variants *[]variant, pk packets.Packet, r route) {
	cl := r.cl
	if r.q == nil || cl.Closed() || (r.sub.NoLocal && pk.Origin == cl.ID) {
		return // mochi drops QoS 0 for a disconnected session too
	}
	v := cl.Properties.ProtocolVersion
	retain := pk.FixedHeader.Retain && v == 5 && r.sub.RetainAsPublished
	frame := h.frame(variants, pk, v, retain, r.ids)
	if frame == nil {
		return
	}
	if !fits(cl, frame) {
		h.Stats.TooLarge.Add(1)
		return
	}
	if r.q.Enqueue(frame) {
		h.Stats.Deliveries.Add(1)
	}
}

// --- the fast path: publishes mochi never has to route ---

// routes is the subscribers of one topic, derived from mochi's topic index
// and valid while the index has not changed since (version).
type routes struct {
	version uint64
	// mochiOnly: something only mochi can deliver matches (an inline
	// subscription, or a shared one nobody else takes).
	mochiOnly bool
	maxQoS    byte // highest granted QoS among the subscribers
	subs      []route
}

// Bounds of the route cache: topics, and bytes of topics and routes (a
// wildcard subscriber appears under every topic it matches); past either the
// cache starts over.
const (
	maxCachedRoutes     = 256 << 10
	maxCachedRouteBytes = 64 << 20
	routeCost           = 96 // one route, besides its subscription identifiers
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
	r := &routes{version: v, mochiOnly: len(subs.InlineSubscriptions) > 0 || (len(subs.Shared) > 0 && !h.SharedElsewhere)}
	for id, sub := range subs.Subscriptions {
		cl, ok := h.server.Clients.Get(id)
		if !ok {
			continue
		}
		r.maxQoS = max(r.maxQoS, sub.Qos)
		if h.canRead != nil && !h.canRead(cl, topic) {
			continue // the ACL is fixed for the broker's life, and so is this client
		}
		q, _ := cl.Net.Conn.(*connq.Conn)
		r.subs = append(r.subs, route{cl: cl, q: q, sub: sub, ids: sortedIDs(cl, sub)})
	}
	cost := int64(len(r.subs)) * routeCost
	for _, rt := range r.subs {
		cost += int64(8 * len(rt.ids))
	}
	h.routes.put(topic, v, r, cost)
	return r
}

// OnPublish delivers a publish whose every matching subscriber takes it at
// QoS 0 straight from the cached routes and tells mochi to skip routing it
// (mochi's own routing rebuilds the subscriber set on every publish). Retained
// publishes and those some subscriber takes at QoS 1/2 go mochi's way.
func (h *Fanout) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Retain || cl.Net.Inline {
		return pk, nil
	}
	r := h.routesFor(pk.TopicName)
	if r.mochiOnly || (pk.FixedHeader.Qos > 0 && r.maxQoS > 0) {
		return pk, nil
	}
	var variants []variant
	for _, rt := range r.subs {
		h.deliver(&variants, pk, rt)
	}
	h.Stats.FastPath.Add(1)
	return pk, packets.CodeSuccessIgnore // routed: mochi acknowledges and stops
}

// OnSubscribed, OnUnsubscribed, OnSessionEstablished (a resumed session's
// subscriptions are re-indexed), OnStarted (stored subscriptions were loaded)
// and OnClientExpired follow every change of mochi's topic index.
func (h *Fanout) OnSubscribed(*mqtt.Client, packets.Packet, []byte) { h.invalidate() }

// OnUnsubscribed invalidates the cached routes.
func (h *Fanout) OnUnsubscribed(*mqtt.Client, packets.Packet) { h.invalidate() }

// OnSessionEstablished invalidates the cached routes.
func (h *Fanout) OnSessionEstablished(*mqtt.Client, packets.Packet) { h.invalidate() }

// OnPacketEncode invalidates the cached routes when a CONNACK is about to go
// out: a resumed session's subscriptions were re-indexed for its new
// connection just before, and OnSessionEstablished only runs after the
// client has its CONNACK (and may already be publishing to itself). It
// also marks plain successful acks for the short encoding (shortAck); the
// broker registers this hook after every other hook that may change an ack.
func (h *Fanout) OnPacketEncode(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Connack && pk.SessionPresent {
		h.invalidate() // only a resumed session changes the index at connect time
	}
	return shortAck(pk)
}

// OnStarted invalidates the cached routes.
func (h *Fanout) OnStarted() { h.invalidate() }

// OnClientExpired invalidates the cached routes.
func (h *Fanout) OnClientExpired(*mqtt.Client) { h.invalidate() }

// frame returns the encoded QoS 0 PUBLISH for one variant, encoding it on first use.
func (h *Fanout) frame(variants *[]variant, pk packets.Packet, version byte, retain bool, ids []int) []byte {
	if version < 5 {
		version = 4 // 3.1 and 3.1.1 PUBLISH frames are identical
	}
	for _, v := range *variants {
		if v.version == version && v.retain == retain && slices.Equal(v.ids, ids) {
			return v.frame
		}
	}
	frame, err := encodeQoS0(pk, version, retain, ids)
	if err != nil {
		h.Log.Error("fanout: encode publish", "topic", clip(pk.TopicName), "error", err)
		return nil
	}
	h.Stats.Encodes.Add(1)
	*variants = append(*variants, variant{version: version, retain: retain, ids: ids, frame: frame})
	return frame
}
