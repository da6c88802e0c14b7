package mqttwire

import "encoding/binary"

// Connect is a CONNECT without a will.
type Connect struct {
	Version    byte // Version311 or Version5
	ClientID   string
	CleanStart bool   // Clean Session in 3.1.1
	KeepAlive  uint16 // seconds; 0: none
	Username   string // sent when not empty
	Password   string // sent when not empty
	Props      Properties
}

// AppendConnect appends c as a CONNECT frame. Props are sent with Version5
// only.
func AppendConnect(b []byte, c *Connect) []byte {
	var flags byte
	if c.CleanStart {
		flags |= 0x02
	}
	rl := 2 + len("MQTT") + 1 + 1 + 2 + 2 + len(c.ClientID)
	if c.Version == Version5 {
		rl += c.Props.blockLen()
	}
	if c.Username != "" {
		flags |= 0x80
		rl += 2 + len(c.Username)
	}
	if c.Password != "" {
		flags |= 0x40
		rl += 2 + len(c.Password)
	}
	b = frameStart(b, TypeConnect, 0, rl)
	b = AppendString(b, "MQTT")
	b = append(b, c.Version, flags)
	b = binary.BigEndian.AppendUint16(b, c.KeepAlive)
	if c.Version == Version5 {
		b = AppendProperties(b, &c.Props)
	}
	b = AppendString(b, c.ClientID)
	if c.Username != "" {
		b = AppendString(b, c.Username)
	}
	if c.Password != "" {
		b = AppendString(b, c.Password)
	}
	return b
}

// Subscription is one topic filter of a SUBSCRIBE.
type Subscription struct {
	Filter string
	// Options is the subscription options byte: the maximum QoS in bits 0-1;
	// MQTT 5 adds No Local (0x04), Retain As Published (0x08) and Retain
	// Handling (0x30).
	Options byte
}

// Subscribe is a SUBSCRIBE.
type Subscribe struct {
	PacketID uint16
	Filters  []Subscription
	Props    Properties // MQTT 5 only
}

// AppendSubscribe appends s as a SUBSCRIBE frame.
func AppendSubscribe(b []byte, version byte, s *Subscribe) []byte {
	n := 0
	for _, f := range s.Filters {
		n += 2 + len(f.Filter) + 1
	}
	b = appendWithID(b, TypeSubscribe, version, s.PacketID, &s.Props, n)
	for _, f := range s.Filters {
		b = append(AppendString(b, f.Filter), f.Options)
	}
	return b
}

// Unsubscribe is an UNSUBSCRIBE.
type Unsubscribe struct {
	PacketID uint16
	Filters  []string
	Props    Properties // MQTT 5 only
}

// AppendUnsubscribe appends u as an UNSUBSCRIBE frame.
func AppendUnsubscribe(b []byte, version byte, u *Unsubscribe) []byte {
	n := 0
	for _, f := range u.Filters {
		n += 2 + len(f)
	}
	b = appendWithID(b, TypeUnsubscribe, version, u.PacketID, &u.Props, n)
	for _, f := range u.Filters {
		b = AppendString(b, f)
	}
	return b
}

// appendWithID starts a SUBSCRIBE or UNSUBSCRIBE whose filters take n
// bytes: the fixed header, the packet id and, with MQTT 5, the properties.
func appendWithID(b []byte, typ, version byte, id uint16, props *Properties, n int) []byte {
	rl := 2 + n
	if version == Version5 {
		rl += props.blockLen()
	}
	b = frameStart(b, typ, 0x02, rl)
	b = binary.BigEndian.AppendUint16(b, id)
	if version == Version5 {
		b = AppendProperties(b, props)
	}
	return b
}

// Publish is a PUBLISH to send.
type Publish struct {
	Topic    string
	QoS      byte // 0, 1 or 2
	Dup      bool
	Retain   bool
	PacketID uint16     // QoS 1 and 2 only
	Props    Properties // MQTT 5 only
	Payload  []byte
}

// AppendPublish appends p as a PUBLISH frame. The payload comes last, so a
// caller that fills payloads itself can append a frame with a placeholder
// payload once and find it at len(frame)-len(p.Payload).
func AppendPublish(b []byte, version byte, p *Publish) []byte {
	rl := publishRemaining(version, p)
	flags := (p.QoS & 0x03) << 1
	if p.Dup {
		flags |= 0x08
	}
	if p.Retain {
		flags |= 0x01
	}
	b = frameStart(b, TypePublish, flags, rl)
	b = AppendString(b, p.Topic)
	if p.QoS > 0 {
		b = binary.BigEndian.AppendUint16(b, p.PacketID)
	}
	if version == Version5 {
		b = AppendProperties(b, &p.Props)
	}
	return append(b, p.Payload...)
}

// PublishLen returns the size of the frame AppendPublish appends for p.
func PublishLen(version byte, p *Publish) int {
	rl := publishRemaining(version, p)
	return 1 + VarintLen(rl) + rl
}

func publishRemaining(version byte, p *Publish) int {
	rl := 2 + len(p.Topic) + len(p.Payload)
	if p.QoS > 0 {
		rl += 2
	}
	if version == Version5 {
		rl += p.Props.blockLen()
	}
	return rl
}

// AppendAck appends a PUBACK, PUBREC, PUBREL or PUBCOMP (typ) for packet id.
// A zero reason is the short form, valid in 3.1.1 and 5; any other reason
// code is MQTT 5 only.
func AppendAck(b []byte, typ byte, id uint16, reason byte) []byte {
	var flags byte
	if typ == TypePubrel {
		flags = 0x02
	}
	if reason == 0 {
		return append(b, typ<<4|flags, 2, byte(id>>8), byte(id))
	}
	return append(b, typ<<4|flags, 3, byte(id>>8), byte(id), reason)
}

// AppendDisconnect appends a DISCONNECT. A zero reason is the short form,
// valid in 3.1.1 and 5; any other reason code is MQTT 5 only, and goes with
// an empty property block: mochi (v2.7.9) ignores a reason code that ends
// the packet.
func AppendDisconnect(b []byte, reason byte) []byte {
	if reason == 0 {
		return append(b, TypeDisconnect<<4, 0)
	}
	return append(b, TypeDisconnect<<4, 2, reason, 0)
}

// AppendPingreq appends a PINGREQ.
func AppendPingreq(b []byte) []byte { return append(b, TypePingreq<<4, 0) }
