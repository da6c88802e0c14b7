package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Retained messages sent on SUBSCRIBE take the path of every other delivery
// to a session: mochi is told not to send them
// (Compatibilities.NoRetainedOnSubscribe, third_party/mochi/PATCHES.md),
// and this hook sends them after the SUBACK, in mochi's order: QoS 0 to the
// connection, QoS 1/2 through the session's outbox, which gives them their
// packet ids, holds them to the client's Receive Maximum and, after a
// reconnect or a restart, resends them in order with everything else.

// retainedWork is what one SUBSCRIBE sends of retained messages.
type retainedWork struct {
	existed []bool                 // per filter: the client had it before this SUBSCRIBE
	subs    []packets.Subscription // granted filters that take retained messages, at the granted QoS
}

// OnSubscribe notes which filters of a SUBSCRIBE the client had already
// (Retain Handling 1 sends retained messages only for new ones).
func (h *Fanout) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if cl.Net.Inline {
		return pk
	}
	w := &retainedWork{existed: make([]bool, len(pk.Filters))}
	for i, f := range pk.Filters {
		_, w.existed[i] = cl.State.Subscriptions.Get(f.Filter)
	}
	h.subscribing.Store(cl, w)
	return pk
}

// OnSubscribed invalidates the cached routes and picks, from the final
// reason codes, the subscriptions whose retained messages are due
// [MQTT-3.3.1-9] [MQTT-3.3.1-10] [MQTT-3.3.1-11]; shared subscriptions
// get none (MQTT 5, 4.8.2).
func (h *Fanout) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	h.invalidate()
	v, ok := h.subscribing.Load(cl)
	if !ok {
		return
	}
	w := v.(*retainedWork)
	for i, f := range pk.Filters {
		if i >= len(reasonCodes) || i >= len(w.existed) || reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		if mqtt.IsSharedFilter(f.Filter) || f.RetainHandling == 2 || (f.RetainHandling == 1 && w.existed[i]) {
			continue
		}
		sub := f
		sub.Qos = reasonCodes[i]
		w.subs = append(w.subs, sub)
	}
}

// OnPacketProcessed sends a SUBSCRIBE's retained messages once mochi has
// queued its SUBACK.
func (h *Fanout) OnPacketProcessed(cl *mqtt.Client, pk packets.Packet, _ error) {
	if pk.FixedHeader.Type != packets.Subscribe {
		return
	}
	v, ok := h.subscribing.LoadAndDelete(cl)
	if !ok {
		return
	}
	w := v.(*retainedWork)
	s := h.sessions.get(cl.ID)
	if s == nil || len(w.subs) == 0 {
		return
	}
	for _, sub := range w.subs {
		rt := routeOf(s, cl.Properties.ProtocolVersion, sub)
		for _, pkv := range h.server.Topics.Messages(sub.Filter) {
			if h.canRead != nil && !h.canRead(cl, pkv.TopicName) {
				continue
			}
			d := h.newRetainedDelivery(pkv)
			d.to(rt)
		}
	}
}
