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
