package hooks

import (
	"bytes"
	"slices"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/broker/connq"
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
	Stats  FanoutStats
}

// NewFanout returns a fan-out hook for server. canRead (nil: allow all)
// applies the broker's ACL to each delivery, as mochi does; limits (nil: keep
// the listener's) sets each connection's queue limits when its session starts.
func NewFanout(server *mqtt.Server, canRead func(cl *mqtt.Client, topic string) bool, limits func(cl *mqtt.Client) connq.Limits) *Fanout {
	return &Fanout{server: server, canRead: canRead, limits: limits}
}

// ID returns the hook's id.
func (h *Fanout) ID() string { return "keyline-fanout" }

// Provides reports which hook methods Fanout implements.
func (h *Fanout) Provides(b byte) bool {
	return b == mqtt.OnSelectSubscribers || b == mqtt.OnSessionEstablish
}

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

// OnSelectSubscribers delivers the QoS 0 part of a publish and leaves the
// rest of subs to mochi.
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
		if cl.Closed() || (sub.NoLocal && pk.Origin == cl.ID) {
			continue // mochi drops QoS 0 for a disconnected session too
		}
		if h.canRead != nil && !h.canRead(cl, pk.TopicName) {
			continue
		}
		v := cl.Properties.ProtocolVersion
		retain := pk.FixedHeader.Retain && v == 5 && sub.RetainAsPublished
		var ids []int
		if v == 5 && len(sub.Identifiers) > 0 {
			for _, i := range sub.Identifiers {
				ids = append(ids, i)
			}
			slices.Sort(ids)
		}
		frame := h.frame(&variants, pk, v, retain, ids)
		if frame == nil {
			continue
		}
		if max := cl.Properties.Props.MaximumPacketSize; max > 0 && uint32(len(frame)) > max {
			h.Stats.TooLarge.Add(1)
			continue
		}
		if q.Enqueue(frame) {
			h.Stats.Deliveries.Add(1)
		}
	}
	return subs
}

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
	out := pk
	out.FixedHeader.Qos, out.FixedHeader.Dup, out.FixedHeader.Retain = 0, false, retain
	out.PacketID = 0
	out.ProtocolVersion = version
	out.Mods = packets.Mods{AllowResponseInfo: true}
	out.Properties.TopicAlias, out.Properties.TopicAliasFlag = 0, false
	out.Properties.SubscriptionIdentifier = ids
	if pk.Expiry > 0 {
		out.Properties.MessageExpiryInterval = uint32(max(1, pk.Expiry-time.Now().Unix())) // [MQTT-3.3.2-6]
	}
	var buf bytes.Buffer
	if err := out.PublishEncode(&buf); err != nil {
		h.Log.Error("fanout: encode publish", "topic", pk.TopicName, "error", err)
		return nil
	}
	h.Stats.Encodes.Add(1)
	*variants = append(*variants, variant{version: version, retain: retain, ids: ids, frame: buf.Bytes()})
	return buf.Bytes()
}
