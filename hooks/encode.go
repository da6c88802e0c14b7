package hooks

import (
	"bytes"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
	"github.com/keyline-mq/keyline/keyshared"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/frame"
)

// Two encoders write PUBLISH frames to clients. The frames Keyline queues
// itself, the fan-out's (encodeFrame, shared by every connection of a
// variant) and Key-Shared deliveries (encodeDelivery), are encoded by
// internal/mqttwire: mochi's encoder asks two maps per property whether each
// of some 28 properties belongs in the packet. What mochi writes itself
// (acks, CONNACK, retained messages on SUBSCRIBE, the deliveries it tracks in
// cluster mode) goes through mochi's encoder, corrected by the Protocol hook.
// (The cluster's envelope between nodes, cluster_codec.go, is no client frame.)

// encodeFrame encodes pk as the PUBLISH that clients of protocol version
// get (3.1 and 3.1.1 frames are identical, so version < 5 encodes as 4), at
// qos, with the retain flag and MQTT 5 subscription identifiers given, for
// the fan-out's frames shared by many connections. An absolute expiry
// (pk.Expiry) becomes the remaining Message Expiry Interval, at least 1 s
// [MQTT-3.3.2-6] (each connection updates it as it writes); response topic,
// correlation data and user properties are kept; a topic alias is not (each
// connection sets its own). A QoS 1/2 frame carries packet id 1: each
// connection writes its own. Check each client's Maximum Packet Size with
// fits before queueing the frame.
func encodeFrame(pk packets.Packet, version byte, retain bool, qos byte, ids []int) (*frame.Publish, error) {
	if version < 5 {
		version = mqttwire.Version311
	}
	p := mqttwire.Publish{Topic: pk.TopicName, QoS: qos, Retain: retain, Payload: pk.Payload}
	if qos > 0 {
		p.PacketID = 1
	}
	if version == mqttwire.Version5 {
		pp := &pk.Properties
		p.Props = mqttwire.Properties{
			PayloadFormat: pp.PayloadFormat, MessageExpiry: pp.MessageExpiryInterval, ContentType: pp.ContentType,
			ResponseTopic: pp.ResponseTopic, CorrelationData: pp.CorrelationData, SubscriptionIDs: ids,
		}
		if pk.Expiry > 0 {
			p.Props.MessageExpiry = uint32(max(1, pk.Expiry-time.Now().Unix()))
		}
		if len(pp.User) > 0 {
			p.Props.User = make([]mqttwire.UserProperty, len(pp.User))
			for i, u := range pp.User {
				p.Props.User[i] = mqttwire.UserProperty{Key: u.Key, Value: u.Val}
			}
		}
	}
	// One allocation, sized to the frame: queued frames are what a slow
	// reader's memory is made of.
	b := mqttwire.AppendPublish(make([]byte, 0, mqttwire.PublishLen(version, &p)), version, &p)
	return frame.Parse(b, version, max(pk.Expiry, 0))
}

// reencode returns p encoded for another protocol version (a session
// resumed by a client of another version than the one its messages were
// queued for). The subscription identifiers are kept for MQTT 5 only.
func reencode(p *frame.Publish, version byte) (*frame.Publish, error) {
	pk, err := decodeFrame(p)
	if err != nil {
		return nil, err
	}
	pk.Expiry = p.ExpiresAt
	ids := pk.Properties.SubscriptionIdentifier
	if version < 5 {
		ids = nil
	}
	return encodeFrame(pk, version, pk.FixedHeader.Retain, pk.FixedHeader.Qos, ids)
}

// decodeFrame decodes p with mochi's decoder.
func decodeFrame(p *frame.Publish) (packets.Packet, error) {
	var fh packets.FixedHeader
	if err := fh.Decode(p.B[0]); err != nil {
		return packets.Packet{}, err
	}
	body := p.B[1:]
	n, used := 0, 0
	for mult := 1; used < len(body); used++ {
		n += int(body[used]&0x7f) * mult
		mult <<= 7
		if body[used]&0x80 == 0 {
			used++
			break
		}
	}
	fh.Remaining = n
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: p.Version}
	err := pk.PublishDecode(bytes.Clone(body[used:])) // the packet must not share the frame's bytes
	return pk, err
}

// fits reports whether n bytes are within cl's Maximum Packet Size (MQTT 5;
// 0 means no limit). A frame that does not fit must not be sent [MQTT-3.1.2-24].
func fits(maxPacket uint32, n int) bool {
	return maxPacket == 0 || uint32(n) <= maxPacket
}

// maxPacketSize returns the client's Maximum Packet Size (0: no limit).
func maxPacketSize(cl *mqtt.Client) uint32 { return cl.Properties.Props.MaximumPacketSize }

// shortAck marks a PUBACK, PUBREC, PUBREL or PUBCOMP that mochi's MQTT 5
// encoder would write without reason code and properties (a reason below
// 0x80 and no reason string or user property: mochi's acks carry the
// granted QoS, 0x01 or 0x02, as "reason") for its MQTT 3.1.1 encoder,
// which writes the same bytes. The MQTT 5 encoder would first ask its
// property tables, two map lookups per property, whether each of some 28
// properties belongs in an ack: 8% of the broker's CPU at 33k QoS 1 msg/s
// in a profile.
func shortAck(pk *packets.Packet) {
	switch pk.FixedHeader.Type {
	case packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp:
		if pk.ProtocolVersion == 5 && pk.ReasonCode < packets.ErrUnspecifiedError.Code && pk.Properties.ReasonString == "" && len(pk.Properties.User) == 0 {
			pk.ProtocolVersion = 4
		}
	}
}

// encodeDelivery encodes a Key-Shared delivery of m at qos with packet id
// (QoS 1 and 2) and the member's subscription identifiers ids (MQTT 5 only)
// as the PUBLISH frame a client of protocol version gets: what mochi's
// WritePacket would write (an absolute expiry becomes the remaining
// interval, at least 1 s [MQTT-3.3.2-6]), with internal/mqttwire's encoder,
// as encodeFrame. The frame is the session's, queued by reference: check it
// with fits before sending.
func encodeDelivery(m *keyshared.Message, version, qos byte, id uint16, ids []int, now time.Time) []byte {
	p := mqttwire.Publish{Topic: m.Topic, QoS: qos, PacketID: id, Payload: m.Payload}
	if version < 5 {
		return mqttwire.AppendPublish(make([]byte, 0, mqttwire.PublishLen(mqttwire.Version311, &p)), mqttwire.Version311, &p)
	}
	p.Props = deliveryProps(m, ids, now)
	if len(m.Props.User) > 0 {
		p.Props.User = make([]mqttwire.UserProperty, len(m.Props.User))
		for i, u := range m.Props.User {
			p.Props.User[i] = mqttwire.UserProperty{Key: u.Key, Value: u.Val}
		}
	}
	return mqttwire.AppendPublish(make([]byte, 0, mqttwire.PublishLen(mqttwire.Version5, &p)), mqttwire.Version5, &p)
}

// deliveryProps are the MQTT 5 properties of a Key-Shared delivery of m
// with subscription identifiers ids, user properties aside.
func deliveryProps(m *keyshared.Message, ids []int, now time.Time) mqttwire.Properties {
	p := mqttwire.Properties{
		ContentType: m.Props.ContentType, ResponseTopic: m.Props.ResponseTopic, CorrelationData: m.Props.CorrelationData,
		SubscriptionIDs: ids,
	}
	if m.Props.PayloadFormatSet {
		p.PayloadFormat = m.Props.PayloadFormat
	}
	if !m.ExpiresAt.IsZero() {
		p.MessageExpiry = uint32(max(1, m.ExpiresAt.Unix()-now.Unix()))
	}
	return p
}

// deliveryLen is len(encodeDelivery(m, version, qos, id, ids, ...)),
// without encoding (or allocating): a member's eligibility for m asks it.
func deliveryLen(m *keyshared.Message, version, qos byte, ids []int) int {
	rl := 2 + len(m.Topic) + len(m.Payload)
	if qos > 0 {
		rl += 2
	}
	if version >= 5 {
		p := deliveryProps(m, ids, m.ExpiresAt) // an expiry takes 5 bytes whatever it says
		n := p.Len()
		for _, u := range m.Props.User {
			n += 1 + 2 + len(u.Key) + 2 + len(u.Val)
		}
		rl += mqttwire.VarintLen(n) + n
	}
	return 1 + mqttwire.VarintLen(rl) + rl
}
