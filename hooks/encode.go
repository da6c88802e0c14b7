package hooks

import (
	"bytes"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// encodeQoS0 encodes pk as the QoS 0 PUBLISH frame that clients of protocol
// version get (3.1 and 3.1.1 frames are identical, so version < 5 encodes as
// 4), with the retain flag and MQTT 5 subscription identifiers given. An
// absolute expiry (pk.Expiry) becomes the remaining Message Expiry Interval,
// at least 1 s [MQTT-3.3.2-6]; response topic and correlation data are kept.
// It is the one encoder of frames that bypass mochi's WritePacket (the
// fan-out and Key-Shared QoS 0 paths): check each client's Maximum Packet
// Size with fits before queueing the frame.
func encodeQoS0(pk packets.Packet, version byte, retain bool, ids []int) ([]byte, error) {
	if version < 5 {
		version = 4
	}
	out := pk
	out.FixedHeader.Qos, out.FixedHeader.Dup, out.FixedHeader.Retain = 0, false, retain
	out.PacketID = 0
	out.ProtocolVersion = version
	out.Mods = packets.Mods{AllowResponseInfo: true}
	out.Properties.TopicAlias, out.Properties.TopicAliasFlag = 0, false
	out.Properties.SubscriptionIdentifier = ids
	if pk.Expiry > 0 {
		out.Properties.MessageExpiryInterval = uint32(max(1, pk.Expiry-time.Now().Unix()))
	}
	var buf bytes.Buffer
	if err := out.PublishEncode(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// fits reports whether frame is within cl's Maximum Packet Size (MQTT 5; 0
// means no limit). A frame that does not fit must not be sent [MQTT-3.1.2-24].
func fits(cl *mqtt.Client, frame []byte) bool {
	max := cl.Properties.Props.MaximumPacketSize
	return max == 0 || uint32(len(frame)) <= max
}
