package mqtttest

// Raw frames for protocol tests: what no client library sends on purpose (a
// property twice, a Receive Maximum of 0), built from mqttwire's
// primitives piece by piece.

import (
	"encoding/binary"
	"slices"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// Frame returns a frame of packet type typ with flags (the low nibble of its
// first byte) whose body is parts, in order.
func Frame(typ, flags byte, parts ...[]byte) []byte {
	body := slices.Concat(parts...)
	return append(mqttwire.AppendHeader(nil, typ, flags, len(body)), body...)
}

// Props returns a property block: its length, then props (each one property
// as PropU16 and the others encode it).
func Props(props ...[]byte) []byte {
	raw := slices.Concat(props...)
	return append(mqttwire.AppendVarint(nil, len(raw)), raw...)
}

// U16 returns v as a two-byte integer (a packet id).
func U16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// Str returns s as an MQTT string (two-byte length, bytes).
func Str(s string) []byte { return mqttwire.AppendString(nil, s) }

// PropByte encodes a one-byte property.
func PropByte(id, v byte) []byte { return []byte{id, v} }

// PropU16 encodes a two-byte integer property.
func PropU16(id byte, v uint16) []byte { return binary.BigEndian.AppendUint16([]byte{id}, v) }

// PropU32 encodes a four-byte integer property.
func PropU32(id byte, v uint32) []byte { return binary.BigEndian.AppendUint32([]byte{id}, v) }

// PropString encodes a string or binary data property.
func PropString(id byte, s string) []byte { return mqttwire.AppendString([]byte{id}, s) }

// PropUser encodes a user property.
func PropUser(key, value string) []byte {
	return mqttwire.AppendString(mqttwire.AppendString([]byte{mqttwire.PropUserProperty}, key), value)
}

// Connect5 returns an MQTT 5 CONNECT for clientID (clean start, keep alive
// 30 s) with the property block props (from Props; nil: empty) and, when
// will is not nil, a QoS 0 will on topic "will/<clientID>" whose property
// block is will.
func Connect5(clientID string, props, will []byte) []byte {
	if props == nil {
		props = Props()
	}
	flags := byte(0x02) // clean start
	if will != nil {
		flags |= 0x04
	}
	parts := [][]byte{Str("MQTT"), {mqttwire.Version5, flags}, U16(30), props, Str(clientID)}
	if will != nil {
		parts = append(parts, will, Str("will/"+clientID), Str("gone"))
	}
	return Frame(mqttwire.TypeConnect, 0, parts...)
}

// ProtocolError is a frame that breaks a rule of MQTT 5 that mochi's decoder
// lets through, with the Reason String of the broker's answer.
type ProtocolError struct {
	Name   string
	Frame  []byte
	Reason string
}

// IsConnect reports whether the frame is a CONNECT (answered by CONNACK
// 0x82; any other by DISCONNECT 0x82).
func (p ProtocolError) IsConnect() bool { return p.Frame[0]>>4 == mqttwire.TypeConnect }

// ProtocolErrors returns a frame of each kind a client sends with a property
// twice, and CONNECTs with Receive Maximum or Maximum Packet Size 0. Those
// that are not CONNECTs follow a CONNECT from Connect5.
func ProtocolErrors() []ProtocolError {
	var (
		topicAlias = PropU16(mqttwire.PropTopicAlias, 1)
		expiry     = PropU32(mqttwire.PropMessageExpiry, 60)
		reason     = PropString(mqttwire.PropReasonString, "why")
		subID      = []byte{mqttwire.PropSubscriptionID, 7}
		sessExpiry = PropU32(mqttwire.PropSessionExpiry, 60)
		willDelay  = PropU32(mqttwire.PropWillDelay, 5)
		authMethod = PropString(mqttwire.PropAuthMethod, "SCRAM")
		user       = PropUser("key", "k1")
		twice      = " appears more than once"
	)
	ack := func(typ, flags byte) ProtocolError {
		name := mqttwire.TypeName(typ)
		return ProtocolError{name, Frame(typ, flags, U16(1), []byte{0}, Props(reason, user, reason)), name + ": Reason String (0x1f)" + twice}
	}
	return []ProtocolError{
		{"CONNECT", Connect5("c1", Props(sessExpiry, user, sessExpiry), nil), "CONNECT: Session Expiry Interval (0x11)" + twice},
		{"CONNECT will", Connect5("c1", Props(), Props(willDelay, willDelay)), "CONNECT will properties: Will Delay Interval (0x18)" + twice},
		{"CONNECT Receive Maximum 0", Connect5("c1", Props(PropU16(mqttwire.PropReceiveMaximum, 0)), nil), "CONNECT: Receive Maximum (0x21) is 0"},
		{"CONNECT Maximum Packet Size 0", Connect5("c1", Props(PropU32(mqttwire.PropMaximumPacketSize, 0)), nil), "CONNECT: Maximum Packet Size (0x27) is 0"},
		{"PUBLISH QoS 0", Frame(mqttwire.TypePublish, 0, Str("a/b"), Props(topicAlias, user, topicAlias), []byte("x")), "PUBLISH: Topic Alias (0x23)" + twice},
		{"PUBLISH QoS 2", Frame(mqttwire.TypePublish, 0x04, Str("a/b"), U16(9), Props(expiry, expiry), []byte("x")), "PUBLISH: Message Expiry Interval (0x02)" + twice},
		ack(mqttwire.TypePuback, 0), ack(mqttwire.TypePubrec, 0), ack(mqttwire.TypePubrel, 2), ack(mqttwire.TypePubcomp, 0),
		{"SUBSCRIBE", Frame(mqttwire.TypeSubscribe, 2, U16(2), Props(subID, subID), Str("a/#"), []byte{1}), "SUBSCRIBE: Subscription Identifier (0x0b)" + twice},
		{"UNSUBSCRIBE", Frame(mqttwire.TypeUnsubscribe, 2, U16(3), Props(reason, user, reason), Str("a/#")), "UNSUBSCRIBE: Reason String (0x1f)" + twice},
		{"DISCONNECT", Frame(mqttwire.TypeDisconnect, 0, []byte{0}, Props(sessExpiry, sessExpiry)), "DISCONNECT: Session Expiry Interval (0x11)" + twice},
		{"AUTH", Frame(mqttwire.TypeAuth, 0, []byte{0x18}, Props(authMethod, authMethod)), "AUTH: Authentication Method (0x15)" + twice},
	}
}
