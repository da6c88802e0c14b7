package hooks

import (
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/keyshared"
)

// ReasonPacketTooLarge (0x95) is the reason a message is dead-lettered with
// when it exceeds a member's Maximum Packet Size.
const ReasonPacketTooLarge byte = 0x95

// groupOut delivers one group's messages to its members and publishes its
// dead letters live (keyshared.Output).
// It is called on the group's dispatcher goroutine (reliable path) or on a
// publisher's goroutine (QoS 0 routing), and never blocks: every write goes
// to the member's connection queue.
type groupOut struct {
	h *KeyShared
	g *ksGroup
	// fl holds a round's QoS 1/2 deliveries until the backend's Flush
	// (keyshared.Output): then each member's go with one write, made by the
	// goroutine that delivered them when the member's connection writer is
	// idle.
	fl *connq.Flusher
	// pk is the packet of the QoS 1/2 delivery being made: only the
	// dispatcher's goroutine delivers at QoS 1/2 (a QoS 0 publish routed on
	// a publisher's goroutine stays at QoS 0), and a packet of its own
	// would be moved to the heap on every delivery, the closure that
	// records it in mochi's in-flight map capturing it (the CPU profile at
	// 2,000 msg/s: a third of the bytes allocated on the path).
	pk packets.Packet
}

var (
	_ keyshared.Output  = (*groupOut)(nil)
	_ keyshared.Flusher = (*groupOut)(nil)
)

// Flush implements keyshared.Flusher.
func (o *groupOut) Flush() {
	if o.fl != nil {
		o.fl.Flush()
	}
}

// DeadLettered implements keyshared.Output: a dead letter, once stored, is
// published live on $dlq/<share>/<original topic>.
func (o *groupOut) DeadLettered(d keyshared.DeadLetter) {
	o.h.dlq.publish(o.g.name, o.g.n.Share, d)
}

// Deliver implements keyshared.Deliverer. The dispatcher only offers a
// member messages it may read (MemberOptions.CanRead), so no check here.
func (o *groupOut) Deliver(member string, m *keyshared.Message, attempt int) bool {
	if o.g.n.Internal() {
		return o.g.deliverInternal(member, m, attempt)
	}
	h := o.h
	cl, ok := h.server.Clients.Get(member)
	if !ok || cl.Closed() || cl.Net.Conn == nil {
		return false
	}
	ms := h.members.get(member, o.g.name)
	if ms == nil {
		return false
	}
	qos := min(m.QoS, ms.qos)
	subID := ms.subID > 0 && cl.Properties.ProtocolVersion == 5
	if qos == 0 {
		pk := publishPacket(m, 0)
		if subID {
			pk.Properties.SubscriptionIdentifier = []int{ms.subID}
		}
		return o.deliverQoS0(cl, pk, m)
	}
	pk := &o.pk
	*pk = publishPacket(m, qos)
	defer func() { *pk = packets.Packet{} }() // keeps no message alive until the next delivery
	if subID {
		// [MQTT-3.3.4-3] holds for shared subscriptions too; it is also in
		// the packet mochi keeps in flight, so a resend carries it.
		pk.Properties.SubscriptionIdentifier = []int{ms.subID}
	}
	// The id is chosen and recorded in mochi's in-flight map while the
	// session's other deliveries cannot take it.
	_, ok = h.allocPacketID(cl, func(id uint16) {
		pk.PacketID = id
		if cl.State.Inflight.Set(*pk) {
			atomic.AddInt64(&h.server.Info.Inflight, 1)
		}
	})
	if !ok {
		return false // every packet id is in use: retried on the next ack or heartbeat
	}
	h.inflight.track(cl.ID, pk.PacketID, o.g, m.Offset)
	if err := o.write(cl, pk, m); err != nil {
		h.inflight.untrack(cl.ID, pk.PacketID)
		if cl.State.Inflight.Delete(pk.PacketID) {
			atomic.AddInt64(&h.server.Info.Inflight, -1)
		}
		if err == packets.ErrPacketTooLarge {
			// The member will never take it; another may: dead-letter it
			// with the reason, rather than retry it here forever.
			h.resultDropped(o.g, member, m.Offset, o.g.d.Reject(member, m.Offset, ReasonPacketTooLarge))
			return true
		}
		return false
	}
	return true
}

// write sends a QoS 1 or 2 delivery: encoded here and queued by reference
// on the member's connection queue (mochi's WritePacket would copy it and
// run its slower encoder), or through mochi for a client without one.
func (o *groupOut) write(cl *mqtt.Client, pk *packets.Packet, m *keyshared.Message) error {
	q, ok := cl.Net.Conn.(*connq.Conn)
	if !ok {
		return cl.WritePacket(*pk)
	}
	frame := encodeDelivery(m, cl.Properties.ProtocolVersion, pk.FixedHeader.Qos, pk.PacketID, pk.Properties.SubscriptionIdentifier, time.Now())
	if !fits(maxPacketSize(cl), len(frame)) {
		return packets.ErrPacketTooLarge
	}
	if o.fl != nil {
		return o.fl.Send(q, frame)
	}
	return q.Send(frame)
}

// deliverQoS0 writes a message at QoS 0: a QoS 0 publish routed on the ring
// (a frame the member's queue policy may drop), or a logged message to a
// member subscribed at QoS 0 (written is done: it cannot acknowledge).
func (o *groupOut) deliverQoS0(cl *mqtt.Client, pk packets.Packet, m *keyshared.Message) bool {
	if m.QoS == 0 {
		q, ok := cl.Net.Conn.(*connq.Conn)
		if !ok {
			return cl.WritePacket(pk) == nil
		}
		p, err := encodeFrame(pk, cl.Properties.ProtocolVersion, false, 0, pk.Properties.SubscriptionIdentifier)
		if err != nil || !fits(maxPacketSize(cl), len(p.B)) {
			return false // dropped and counted by the router
		}
		return q.Enqueue(p)
	}
	err := cl.WritePacket(pk)
	switch {
	case err == packets.ErrPacketTooLarge:
		err = o.g.d.Reject(cl.ID, m.Offset, ReasonPacketTooLarge)
	case err != nil:
		return false
	default:
		err = o.g.d.Ack(cl.ID, m.Offset)
	}
	o.h.resultDropped(o.g, cl.ID, m.Offset, err)
	return true
}

// Revoke implements keyshared.Deliverer: the delivery is forgotten, also in
// the session's inflight state, so a resumed session does not resend it.
func (o *groupOut) Revoke(member string, offset uint64) {
	if o.g.n.Internal() {
		o.g.revokeInternal(member, offset)
		return
	}
	h := o.h
	id, ok := h.inflight.revoke(o.g.name, member, offset)
	if !ok {
		return
	}
	if cl, found := h.server.Clients.Get(member); found && cl.State.Inflight.Delete(id) {
		atomic.AddInt64(&h.server.Info.Inflight, -1)
	}
}

// allocPacketID picks a packet id for cl (see KeySharedConfig.AllocPacketID).
func (h *KeyShared) allocPacketID(cl *mqtt.Client, set func(id uint16)) (uint16, bool) {
	if h.cfg.AllocPacketID != nil {
		return h.cfg.AllocPacketID(cl, set)
	}
	id, err := cl.NextPacketID()
	if err != nil {
		return 0, false
	}
	set(uint16(id))
	return uint16(id), true
}

// publishPacket is the PUBLISH that carries m at qos.
func publishPacket(m *keyshared.Message, qos byte) packets.Packet {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos},
		TopicName:   m.Topic,
		Payload:     m.Payload,
		Created:     m.PublishedAt.Unix(),
		Properties: packets.Properties{
			PayloadFormat:     m.Props.PayloadFormat,
			PayloadFormatFlag: m.Props.PayloadFormatSet,
			ContentType:       m.Props.ContentType,
			ResponseTopic:     m.Props.ResponseTopic,
			CorrelationData:   m.Props.CorrelationData,
		},
	}
	if !m.ExpiresAt.IsZero() {
		pk.Expiry = m.ExpiresAt.Unix() // the encoder turns it into the remaining interval
	}
	if len(m.Props.User) > 0 {
		pk.Properties.User = make([]packets.UserProperty, len(m.Props.User))
		for i, u := range m.Props.User {
			pk.Properties.User[i] = packets.UserProperty{Key: u.Key, Val: u.Val}
		}
	}
	return pk
}
