package hooks

import (
	"errors"
	"fmt"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/keyshared"
)

// message is the group log entry of a publish.
func (h *KeyShared) message(pk packets.Packet) keyshared.Message {
	m := keyshared.Message{
		Topic:       pk.TopicName,
		Key:         pk.TopicName,
		Payload:     pk.Payload,
		QoS:         pk.FixedHeader.Qos,
		PublishedAt: time.Now(),
		Props: keyshared.Properties{
			PayloadFormat:    pk.Properties.PayloadFormat,
			PayloadFormatSet: pk.Properties.PayloadFormatFlag,
			ContentType:      pk.Properties.ContentType,
			ResponseTopic:    pk.Properties.ResponseTopic,
			CorrelationData:  pk.Properties.CorrelationData,
		},
	}
	for _, u := range pk.Properties.User {
		if u.Key == h.cfg.KeyProperty {
			m.Key = u.Val
			break
		}
	}
	if len(pk.Properties.User) > 0 {
		m.Props.User = make([]keyshared.UserProperty, len(pk.Properties.User))
		for i, u := range pk.Properties.User {
			m.Props.User[i] = keyshared.UserProperty{Key: u.Key, Val: u.Val}
		}
	}
	if pk.Expiry > 0 {
		m.ExpiresAt = time.Unix(pk.Expiry, 0)
	} else if pk.Properties.MessageExpiryInterval > 0 {
		m.ExpiresAt = m.PublishedAt.Add(time.Duration(pk.Properties.MessageExpiryInterval) * time.Second)
	}
	return m
}

// publish appends a QoS >= 1 publish to the logs of groups; the publisher's
// PUBACK/PUBREC leaves only once the append is durable (it is held in the
// connection's queue, or, without one, publish waits). A QoS 0 publish is
// routed on each group's ring. A refused append is never acknowledged as a
// success: MQTT 5 gets reason 0x97 (backlog full) or 0x80, MQTT 3.1.1 is
// disconnected.
func (h *KeyShared) publish(cl *mqtt.Client, pk packets.Packet, groups []*ksGroup) (packets.Packet, error) {
	m := h.message(pk)
	if max := h.cfg.MaxKeySize; max > 0 && len(m.Key) > max && !cl.Net.Inline {
		h.KeysTooLong.Add(1)
		h.Log.Info("refused a publish: routing key longer than max-key-size", "client", clip(cl.ID), "topic", clip(pk.TopicName), "key_bytes", len(m.Key), "max", max)
		return h.refuse(cl, pk, packets.ErrPayloadFormatInvalid, fmt.Errorf("keyshared: routing key of %d bytes, at most %d", len(m.Key), max))
	}
	if cl.Net.Inline {
		// The only inline publisher that reaches here is the dead-letter
		// publisher (messages from other nodes are kept out by
		// ClusterKeyShared): a dead letter on $dlq/... matched a group such
		// as $share/ops/$dlq/#. It goes to that group best effort, at QoS 0:
		// routed on the ring, never logged, not acknowledged. It is stored
		// already with the group it died in (listed and replayed through the
		// admin API); logged again, a dead letter that died in the $dlq group
		// too would be published on $dlq/... once more, and again, without end.
		m.QoS = 0
	}
	if m.QoS == 0 {
		// A copy of its own: &m handed to Route would move every publish's
		// message to the heap, QoS 1 and 2 too (CPU profile at 2,000 msg/s).
		rm := m
		for _, g := range groups {
			g.d.Route(&rm)
		}
		return pk, nil
	}
	names := make([]string, len(groups))
	for i, g := range groups {
		names[i] = g.name
	}
	v5 := cl.Properties.ProtocolVersion == 5
	if q, ok := cl.Net.Conn.(*connq.Conn); ok {
		// Do not make the publisher wait for the commit: mochi goes on reading
		// while its acknowledgement waits in the connection's queue until the
		// commit that covers this message is durable (or turns into a failure).
		typ := packets.Puback
		if pk.FixedHeader.Qos == 2 {
			typ = packets.Pubrec
		}
		hold := q.HoldAck(typ, pk.PacketID, v5)
		topic := pk.TopicName // not pk: the callback would keep the whole packet on the heap
		h.backend.AppendMultiAsync(names, m, func(rs []keyshared.AppendResult) {
			if err := h.appendFailure(cl, topic, rs); err != nil {
				hold.Fail(refusalCode(err).Code)
				return
			}
			if h.acks != nil {
				h.acks.Release(hold) // goes with the commit's other acknowledgements
				return
			}
			hold.Release()
		})
		return pk, nil
	}
	failed := h.appendFailure(cl, pk.TopicName, keyshared.AppendMulti(h.backend, names, m))
	if failed == nil {
		return pk, nil
	}
	return h.refuse(cl, pk, refusalCode(failed), fmt.Errorf("keyshared: message not stored: %w", failed))
}

// refuse answers a publish Key-Shared cannot take: MQTT 5 QoS 1/2 with code
// (mochi writes it in the PUBACK/PUBREC), QoS 0 dropped, MQTT 3.1.1 QoS 1/2
// disconnected without an acknowledgement (it has no way to refuse).
func (h *KeyShared) refuse(cl *mqtt.Client, pk packets.Packet, code packets.Code, why error) (packets.Packet, error) {
	switch {
	case pk.FixedHeader.Qos == 0:
	case cl.Properties.ProtocolVersion == 5:
		// Written here: mochi would answer a QoS 2 publish with a PUBACK.
		typ := packets.Puback
		if pk.FixedHeader.Qos == 2 {
			typ = packets.Pubrec
		}
		_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: pk.PacketID, ReasonCode: code.Code})
	default:
		cl.Stop(why)
	}
	return pk, packets.ErrRejectPacket
}

// appendFailure logs and counts refused appends and returns the error to
// report, if any (a full backlog wins: it is the one a publisher can act on).
func (h *KeyShared) appendFailure(cl *mqtt.Client, topic string, rs []keyshared.AppendResult) error {
	var failed error
	for _, r := range rs {
		if r.Err != nil {
			h.AppendErrors.Add(1)
			h.Log.Warn("group refused a message", "group", r.Group, "topic", clip(topic), "client", cl.ID, "error", r.Err)
			if failed == nil || errors.Is(r.Err, keyshared.ErrBacklogFull) {
				failed = r.Err
			}
		}
	}
	return failed
}

// refusalCode is the MQTT 5 reason code for a refused append.
func refusalCode(err error) packets.Code {
	if errors.Is(err, keyshared.ErrBacklogFull) {
		return packets.ErrQuotaExceeded
	}
	return packets.ErrUnspecifiedError
}

// clip shortens a client-controlled string for a log line.
func clip(s string) string {
	const max = 128
	if len(s) <= max {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:max], len(s))
}
