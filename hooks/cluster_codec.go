package hooks

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// A message travels between nodes as a small envelope around the publish
// encoded as an MQTT 5 PUBLISH, so every property survives the trip:
//
//	version(1) | origin client id (uvarint length + bytes) |
//	created (varint, unix s) | expiry (varint, unix s, 0: none) | PUBLISH packet
const envelopeVersion = 1

var errEnvelope = errors.New("hooks: malformed cluster envelope")

// encodeEnvelope encodes pk for other nodes.
func encodeEnvelope(pk packets.Packet) ([]byte, error) {
	out := pk
	out.ProtocolVersion = 5
	out.Mods = packets.Mods{AllowResponseInfo: true}
	out.FixedHeader.Dup = false
	out.Properties.TopicAlias, out.Properties.TopicAliasFlag = 0, false
	out.Properties.SubscriptionIdentifier = nil
	if out.FixedHeader.Qos > 0 {
		out.PacketID = 1 // the decoder wants one; the receiver assigns its own
	}
	var buf bytes.Buffer
	// Room for the whole envelope at once (its header, the fixed header,
	// the topic, the properties' usual size and the payload): grown piece
	// by piece it was five allocations per forwarded publish, now one.
	buf.Grow(1 + 3*binary.MaxVarintLen64 + len(pk.Origin) + 5 + 2 + len(pk.TopicName) + 2 + 64 + len(pk.Payload))
	buf.WriteByte(envelopeVersion)
	var hdr [2 * binary.MaxVarintLen64]byte
	buf.Write(binary.AppendUvarint(hdr[:0], uint64(len(pk.Origin))))
	buf.WriteString(pk.Origin)
	b := binary.AppendVarint(hdr[:0], pk.Created)
	b = binary.AppendVarint(b, pk.Expiry)
	buf.Write(b)
	if err := out.PublishEncode(&buf); err != nil {
		return nil, fmt.Errorf("hooks: encode publish for the cluster: %w", err)
	}
	return buf.Bytes(), nil
}

// decodeEnvelope decodes a message from another node. The packet's strings
// and payload are copies, not views into data.
func decodeEnvelope(data []byte) (packets.Packet, error) {
	var pk packets.Packet
	if len(data) < 2 || data[0] != envelopeVersion {
		return pk, errEnvelope
	}
	r := bytes.NewReader(data[1:])
	n, err := binary.ReadUvarint(r)
	if err != nil || n > uint64(r.Len()) {
		return pk, errEnvelope
	}
	origin := make([]byte, n)
	_, _ = r.Read(origin)
	created, err1 := binary.ReadVarint(r)
	expiry, err2 := binary.ReadVarint(r)
	if err1 != nil || err2 != nil {
		return pk, errEnvelope
	}
	hb, err := r.ReadByte()
	if err != nil {
		return pk, errEnvelope
	}
	if err := pk.FixedHeader.Decode(hb); err != nil || pk.FixedHeader.Type != packets.Publish {
		return pk, errEnvelope
	}
	length, _, err := packets.DecodeLength(r)
	if err != nil || length != r.Len() {
		// Checked before allocating: any NATS client of the account can
		// publish on Keyline's subjects, and a length of 256 MiB costs
		// nothing to send.
		return pk, errEnvelope
	}
	body := make([]byte, length)
	_, _ = r.Read(body)
	pk.FixedHeader.Remaining = length
	pk.ProtocolVersion = 5
	if err := pk.PublishDecode(body); err != nil {
		return pk, fmt.Errorf("%w: %v", errEnvelope, err)
	}
	pk.TopicName = strings.Clone(pk.TopicName)
	pk.Origin, pk.Created, pk.Expiry = string(origin), created, expiry
	return pk, nil
}

// remainingExpiry sets pk's message expiry interval to what is left of it
// and reports false when it has already expired.
func remainingExpiry(pk *packets.Packet, now time.Time) bool {
	if pk.Expiry <= 0 {
		return true
	}
	left := pk.Expiry - now.Unix()
	if left <= 0 {
		return false
	}
	pk.Properties.MessageExpiryInterval = uint32(left)
	return true
}
