package mqttwire

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// MQTT 5 property identifiers.
const (
	PropPayloadFormat           byte = 0x01
	PropMessageExpiry           byte = 0x02
	PropContentType             byte = 0x03
	PropResponseTopic           byte = 0x08
	PropCorrelationData         byte = 0x09
	PropSubscriptionID          byte = 0x0B
	PropSessionExpiry           byte = 0x11
	PropAssignedClientID        byte = 0x12
	PropServerKeepAlive         byte = 0x13
	PropAuthMethod              byte = 0x15
	PropAuthData                byte = 0x16
	PropRequestProblemInfo      byte = 0x17
	PropWillDelay               byte = 0x18
	PropRequestResponseInfo     byte = 0x19
	PropResponseInfo            byte = 0x1A
	PropServerReference         byte = 0x1C
	PropReasonString            byte = 0x1F
	PropReceiveMaximum          byte = 0x21
	PropTopicAliasMaximum       byte = 0x22
	PropTopicAlias              byte = 0x23
	PropMaximumQoS              byte = 0x24
	PropRetainAvailable         byte = 0x25
	PropUserProperty            byte = 0x26
	PropMaximumPacketSize       byte = 0x27
	PropWildcardAvailable       byte = 0x28
	PropSubscriptionIDAvailable byte = 0x29
	PropSharedAvailable         byte = 0x2A
)

// Kinds of property value.
const (
	kindUnknown = iota
	kindByte
	kindUint16
	kindUint32
	kindVarint
	kindString // a string or binary data
	kindPair   // a user property: two strings
)

var propKinds = [0x2B]uint8{
	PropPayloadFormat: kindByte, PropRequestProblemInfo: kindByte, PropRequestResponseInfo: kindByte,
	PropMaximumQoS: kindByte, PropRetainAvailable: kindByte, PropWildcardAvailable: kindByte,
	PropSubscriptionIDAvailable: kindByte, PropSharedAvailable: kindByte,
	PropServerKeepAlive: kindUint16, PropReceiveMaximum: kindUint16, PropTopicAliasMaximum: kindUint16,
	PropTopicAlias:    kindUint16,
	PropMessageExpiry: kindUint32, PropSessionExpiry: kindUint32, PropWillDelay: kindUint32,
	PropMaximumPacketSize: kindUint32,
	PropSubscriptionID:    kindVarint,
	PropContentType:       kindString, PropResponseTopic: kindString, PropAssignedClientID: kindString,
	PropAuthMethod: kindString, PropResponseInfo: kindString, PropServerReference: kindString,
	PropReasonString: kindString, PropCorrelationData: kindString, PropAuthData: kindString,
	PropUserProperty: kindPair,
}

var propNames = [0x2B]string{
	PropPayloadFormat: "Payload Format Indicator", PropMessageExpiry: "Message Expiry Interval",
	PropContentType: "Content Type", PropResponseTopic: "Response Topic", PropCorrelationData: "Correlation Data",
	PropSubscriptionID: "Subscription Identifier", PropSessionExpiry: "Session Expiry Interval",
	PropAssignedClientID: "Assigned Client Identifier", PropServerKeepAlive: "Server Keep Alive",
	PropAuthMethod: "Authentication Method", PropAuthData: "Authentication Data",
	PropRequestProblemInfo: "Request Problem Information", PropWillDelay: "Will Delay Interval",
	PropRequestResponseInfo: "Request Response Information", PropResponseInfo: "Response Information",
	PropServerReference: "Server Reference", PropReasonString: "Reason String",
	PropReceiveMaximum: "Receive Maximum", PropTopicAliasMaximum: "Topic Alias Maximum", PropTopicAlias: "Topic Alias",
	PropMaximumQoS: "Maximum QoS", PropRetainAvailable: "Retain Available", PropUserProperty: "User Property",
	PropMaximumPacketSize: "Maximum Packet Size", PropWildcardAvailable: "Wildcard Subscription Available",
	PropSubscriptionIDAvailable: "Subscription Identifier Available", PropSharedAvailable: "Shared Subscription Available",
}

// PropName returns the specification's name of property id with its
// identifier ("Topic Alias (0x23)"), or "unknown property (0x..)".
func PropName(id byte) string {
	if int(id) < len(propNames) && propNames[id] != "" {
		return fmt.Sprintf("%s (0x%02x)", propNames[id], id)
	}
	return fmt.Sprintf("unknown property (0x%02x)", id)
}

func propKind(id byte) uint8 {
	if int(id) < len(propKinds) {
		return propKinds[id]
	}
	return kindUnknown
}

// Property is one MQTT 5 property as it stands in a frame; its slices alias
// the frame.
type Property struct {
	ID byte
	// Name is a user property's name; nil for other properties.
	Name []byte
	// Value is the value's bytes: big-endian for a one-, two- or four-byte
	// integer, the encoded bytes of a variable byte integer, a string or
	// binary data without its length.
	Value []byte
}

// Uint returns the value of an integer property (byte, two-byte, four-byte
// or variable byte integer); 0 for other properties.
func (p Property) Uint() uint32 {
	switch propKind(p.ID) {
	case kindByte:
		return uint32(p.Value[0])
	case kindUint16:
		return uint32(binary.BigEndian.Uint16(p.Value))
	case kindUint32:
		return binary.BigEndian.Uint32(p.Value)
	case kindVarint:
		n, _, _ := ReadVarint(p.Value)
		return uint32(n)
	}
	return 0
}

// RawProperties is the content of an MQTT 5 property block as it stands in a
// frame (without the block's length).
type RawProperties []byte

// size returns the size of the property at the front of r, its identifier
// included: 0 when the identifier is unknown or the value runs past the end.
// Validate, UserValue, Skip and Next walk a block with it; the load generator
// reads every delivery's properties that way, so it stays small.
func (r RawProperties) size() int {
	if len(r) == 0 {
		return 0
	}
	var n int
	switch propKind(r[0]) {
	case kindByte:
		n = 2
	case kindUint16:
		n = 3
	case kindUint32:
		n = 5
	case kindVarint:
		_, size, err := ReadVarint(r[1:])
		if err != nil {
			return 0
		}
		n = 1 + size
	case kindString:
		if len(r) < 3 {
			return 0
		}
		n = 3 + int(binary.BigEndian.Uint16(r[1:]))
	case kindPair:
		if len(r) < 3 {
			return 0
		}
		k := 3 + int(binary.BigEndian.Uint16(r[1:]))
		if len(r) < k+2 {
			return 0
		}
		n = k + 2 + int(binary.BigEndian.Uint16(r[k:]))
	default:
		return 0
	}
	if len(r) < n {
		return 0
	}
	return n
}

// badProperty says why r.size() is 0.
func (r RawProperties) badProperty() error {
	switch {
	case len(r) == 0:
		return malformed("no property left to read")
	case propKind(r[0]) == kindUnknown:
		return malformed("unknown property 0x%02x", r[0])
	default:
		return malformed("property 0x%02x runs past the end of its block", r[0])
	}
}

// Next reads the first property of r and returns it with the properties
// after it. An unknown identifier or a value that runs past the end wraps
// ErrMalformed.
func (r RawProperties) Next() (Property, RawProperties, error) {
	n := r.size()
	if n == 0 {
		return Property{}, nil, r.badProperty()
	}
	p := Property{ID: r[0]}
	switch propKind(p.ID) {
	case kindString:
		p.Value = r[3:n:n]
	case kindPair:
		k := 3 + int(binary.BigEndian.Uint16(r[1:]))
		p.Name, p.Value = r[3:k:k], r[k+2:n:n]
	default:
		p.Value = r[1:n:n]
	}
	return p, r[n:], nil
}

// Skip returns the identifier of the first property of r and the
// properties after it, without reading its value: the cheapest walk of a
// block. ok is false for an unknown identifier or a value that runs past
// the end (Next says which).
func (r RawProperties) Skip() (id byte, rest RawProperties, ok bool) {
	n := r.size()
	if n == 0 {
		return 0, nil, false
	}
	return r[0], r[n:], true
}

// Validate reports whether r is a sequence of well-formed properties.
func (r RawProperties) Validate() error {
	for len(r) > 0 {
		n := r.size()
		if n == 0 {
			return r.badProperty()
		}
		r = r[n:]
	}
	return nil
}

// UserValue returns the value of the first user property called name. It
// stops at the first malformed property.
func (r RawProperties) UserValue(name string) ([]byte, bool) {
	for len(r) > 0 {
		n := r.size()
		if n == 0 {
			return nil, false
		}
		if r[0] == PropUserProperty {
			k := 3 + int(binary.BigEndian.Uint16(r[1:]))
			if string(r[3:k]) == name {
				return r[k+2 : n : n], true
			}
		}
		r = r[n:]
	}
	return nil, false
}

// UserProperty is an MQTT 5 user property.
type UserProperty struct {
	Key, Value string
}

// Properties holds the MQTT 5 properties Keyline's tools send and read. A
// field at its zero value is not sent, except where its Has flag is set;
// Parse sets a Has flag whenever the property was present. Parse checks and
// skips the properties that have no field here: authentication method and
// data, will delay, request problem/response information, response
// information, server reference and the four "available" flags of CONNACK.
type Properties struct {
	PayloadFormat     byte
	MessageExpiry     uint32 // seconds
	HasMessageExpiry  bool   // sent with a zero MessageExpiry too
	ContentType       string
	ResponseTopic     string
	CorrelationData   []byte
	SubscriptionIDs   []int // each at most MaxRemaining
	SessionExpiry     uint32
	AssignedClientID  string
	ServerKeepAlive   uint16
	ReasonString      string
	ReceiveMaximum    uint16
	TopicAliasMaximum uint16
	TopicAlias        uint16
	MaximumQoS        byte
	HasMaximumQoS     bool // sent with a zero MaximumQoS too
	MaximumPacketSize uint32
	User              []UserProperty
}

// Len returns the size of the property block AppendProperties writes for p,
// without its length prefix.
func (p *Properties) Len() int {
	n := 0
	add := func(present bool, size int) {
		if present {
			n += 1 + size
		}
	}
	add(p.PayloadFormat != 0, 1)
	add(p.MessageExpiry != 0 || p.HasMessageExpiry, 4)
	add(p.ContentType != "", 2+len(p.ContentType))
	add(p.ResponseTopic != "", 2+len(p.ResponseTopic))
	add(len(p.CorrelationData) > 0, 2+len(p.CorrelationData))
	for _, id := range p.SubscriptionIDs {
		n += 1 + VarintLen(id)
	}
	add(p.SessionExpiry != 0, 4)
	add(p.AssignedClientID != "", 2+len(p.AssignedClientID))
	add(p.ServerKeepAlive != 0, 2)
	add(p.ReasonString != "", 2+len(p.ReasonString))
	add(p.ReceiveMaximum != 0, 2)
	add(p.TopicAliasMaximum != 0, 2)
	add(p.TopicAlias != 0, 2)
	add(p.MaximumQoS != 0 || p.HasMaximumQoS, 1)
	add(p.MaximumPacketSize != 0, 4)
	for _, u := range p.User {
		n += 1 + 2 + len(u.Key) + 2 + len(u.Value)
	}
	return n
}

// blockLen is the size of p's block with its length prefix.
func (p *Properties) blockLen() int {
	n := p.Len()
	return VarintLen(n) + n
}

// AppendProperties appends p as a property block: its length, then the
// properties.
func AppendProperties(b []byte, p *Properties) []byte {
	b = AppendVarint(b, p.Len())
	if p.PayloadFormat != 0 {
		b = append(b, PropPayloadFormat, p.PayloadFormat)
	}
	if p.MessageExpiry != 0 || p.HasMessageExpiry {
		b = binary.BigEndian.AppendUint32(append(b, PropMessageExpiry), p.MessageExpiry)
	}
	if p.ContentType != "" {
		b = AppendString(append(b, PropContentType), p.ContentType)
	}
	if p.ResponseTopic != "" {
		b = AppendString(append(b, PropResponseTopic), p.ResponseTopic)
	}
	if len(p.CorrelationData) > 0 {
		b = AppendBinary(append(b, PropCorrelationData), p.CorrelationData)
	}
	for _, id := range p.SubscriptionIDs {
		b = AppendVarint(append(b, PropSubscriptionID), id)
	}
	if p.SessionExpiry != 0 {
		b = binary.BigEndian.AppendUint32(append(b, PropSessionExpiry), p.SessionExpiry)
	}
	if p.AssignedClientID != "" {
		b = AppendString(append(b, PropAssignedClientID), p.AssignedClientID)
	}
	if p.ServerKeepAlive != 0 {
		b = binary.BigEndian.AppendUint16(append(b, PropServerKeepAlive), p.ServerKeepAlive)
	}
	if p.ReasonString != "" {
		b = AppendString(append(b, PropReasonString), p.ReasonString)
	}
	if p.ReceiveMaximum != 0 {
		b = binary.BigEndian.AppendUint16(append(b, PropReceiveMaximum), p.ReceiveMaximum)
	}
	if p.TopicAliasMaximum != 0 {
		b = binary.BigEndian.AppendUint16(append(b, PropTopicAliasMaximum), p.TopicAliasMaximum)
	}
	if p.TopicAlias != 0 {
		b = binary.BigEndian.AppendUint16(append(b, PropTopicAlias), p.TopicAlias)
	}
	if p.MaximumQoS != 0 || p.HasMaximumQoS {
		b = append(b, PropMaximumQoS, p.MaximumQoS)
	}
	if p.MaximumPacketSize != 0 {
		b = binary.BigEndian.AppendUint32(append(b, PropMaximumPacketSize), p.MaximumPacketSize)
	}
	for _, u := range p.User {
		b = AppendString(append(b, PropUserProperty), u.Key)
		b = AppendString(b, u.Value)
	}
	return b
}

// Parse decodes r into Properties, copying what it keeps: the result does
// not alias r. A later occurrence of a single-valued property replaces an
// earlier one; user properties and subscription identifiers accumulate in
// order.
func (r RawProperties) Parse() (Properties, error) {
	var p Properties
	for len(r) > 0 {
		var (
			pr  Property
			err error
		)
		if pr, r, err = r.Next(); err != nil {
			return Properties{}, err
		}
		switch pr.ID {
		case PropPayloadFormat:
			p.PayloadFormat = byte(pr.Uint())
		case PropMessageExpiry:
			p.MessageExpiry, p.HasMessageExpiry = pr.Uint(), true
		case PropContentType:
			p.ContentType = string(pr.Value)
		case PropResponseTopic:
			p.ResponseTopic = string(pr.Value)
		case PropCorrelationData:
			p.CorrelationData = nil
			if len(pr.Value) > 0 {
				p.CorrelationData = slices.Clone(pr.Value)
			}
		case PropSubscriptionID:
			p.SubscriptionIDs = append(p.SubscriptionIDs, int(pr.Uint()))
		case PropSessionExpiry:
			p.SessionExpiry = pr.Uint()
		case PropAssignedClientID:
			p.AssignedClientID = string(pr.Value)
		case PropServerKeepAlive:
			p.ServerKeepAlive = uint16(pr.Uint())
		case PropReasonString:
			p.ReasonString = string(pr.Value)
		case PropReceiveMaximum:
			p.ReceiveMaximum = uint16(pr.Uint())
		case PropTopicAliasMaximum:
			p.TopicAliasMaximum = uint16(pr.Uint())
		case PropTopicAlias:
			p.TopicAlias = uint16(pr.Uint())
		case PropMaximumQoS:
			p.MaximumQoS, p.HasMaximumQoS = byte(pr.Uint()), true
		case PropMaximumPacketSize:
			p.MaximumPacketSize = pr.Uint()
		case PropUserProperty:
			p.User = append(p.User, UserProperty{Key: string(pr.Name), Value: string(pr.Value)})
		}
	}
	return p, nil
}
