package mqttwire

import "encoding/binary"

// The decoders of what a broker sends. Each checks the packet type, reads
// the fields and validates the property block; what it returns aliases the
// packet's body (invariant 2 of the package doc).

// Connack is a decoded CONNACK.
type Connack struct {
	SessionPresent bool
	ReasonCode     byte          // the return code in 3.1.1
	Props          RawProperties // MQTT 5; nil when absent
}

// DecodeConnack decodes a CONNACK. A 3.1.1 CONNACK's bytes after the return
// code are ignored; an MQTT 5 CONNACK without properties is accepted.
func DecodeConnack(version byte, p Packet) (Connack, error) {
	if err := expect(p, TypeConnack); err != nil {
		return Connack{}, err
	}
	d := dec{b: p.Body}
	c := Connack{SessionPresent: d.byte1("CONNACK flags")&0x01 != 0, ReasonCode: d.byte1("CONNACK reason code")}
	if version == Version5 {
		c.Props = d.trailer("CONNACK")
	}
	return c, d.validate(c.Props)
}

// PublishView is a decoded PUBLISH; its slices alias the packet's body.
type PublishView struct {
	Topic    []byte
	QoS      byte
	Dup      bool
	Retain   bool
	PacketID uint16        // 0 for QoS 0
	Props    RawProperties // MQTT 5
	Payload  []byte
}

// DecodePublish decodes a PUBLISH. QoS 3 is malformed. (Written out by
// hand, without dec: the load generator decodes every delivery with it.)
func DecodePublish(version byte, p Packet) (PublishView, error) {
	if p.Type != TypePublish {
		return PublishView{}, expect(p, TypePublish)
	}
	m := PublishView{QoS: (p.Flags >> 1) & 0x03, Dup: p.Flags&0x08 != 0, Retain: p.Flags&0x01 != 0}
	if m.QoS == 3 {
		return PublishView{}, malformed("PUBLISH with QoS 3")
	}
	b := p.Body
	if len(b) < 2 {
		return PublishView{}, shortPublish("topic")
	}
	n := 2 + int(binary.BigEndian.Uint16(b))
	if len(b) < n {
		return PublishView{}, shortPublish("topic")
	}
	m.Topic, b = b[2:n:n], b[n:]
	if m.QoS > 0 {
		if len(b) < 2 {
			return PublishView{}, shortPublish("packet id")
		}
		m.PacketID, b = binary.BigEndian.Uint16(b), b[2:]
	}
	if version == Version5 {
		n, size, err := ReadVarint(b)
		if err != nil || len(b) < size+n {
			return PublishView{}, shortPublish("property block")
		}
		m.Props, b = RawProperties(b[size:size+n:size+n]), b[size+n:]
		if err := m.Props.Validate(); err != nil {
			return PublishView{}, err
		}
	}
	m.Payload = b
	return m, nil
}

func shortPublish(what string) error { return malformed("PUBLISH %s runs past the end", what) }

// Suback is a decoded SUBACK or UNSUBACK.
type Suback struct {
	PacketID    uint16
	Props       RawProperties // MQTT 5
	ReasonCodes []byte        // one per filter; none in a 3.1.1 UNSUBACK
}

// DecodeSuback decodes a SUBACK or an UNSUBACK (the two share a layout).
func DecodeSuback(version byte, p Packet) (Suback, error) {
	if err := expect(p, TypeSuback, TypeUnsuback); err != nil {
		return Suback{}, err
	}
	d := dec{b: p.Body}
	s := Suback{PacketID: d.u16("packet id")}
	if version == Version5 {
		s.Props = d.properties()
	}
	if err := d.validate(s.Props); err != nil {
		return Suback{}, err
	}
	s.ReasonCodes = d.b
	return s, nil
}

// Ack is a decoded PUBACK, PUBREC, PUBREL or PUBCOMP.
type Ack struct {
	PacketID   uint16
	ReasonCode byte          // 0 (success) in 3.1.1 and in the short form
	Props      RawProperties // MQTT 5; nil when absent
}

// DecodeAck decodes a PUBACK, PUBREC, PUBREL or PUBCOMP. A 3.1.1 ack's
// bytes after the packet id are ignored.
func DecodeAck(version byte, p Packet) (Ack, error) {
	if p.Type < TypePuback || p.Type > TypePubcomp {
		return Ack{}, expect(p, TypePuback, TypePubrec, TypePubrel, TypePubcomp)
	}
	b := p.Body
	if len(b) < 2 {
		return Ack{}, malformed("%s packet id runs past the end", TypeName(p.Type))
	}
	a := Ack{PacketID: binary.BigEndian.Uint16(b)}
	if version != Version5 || len(b) == 2 {
		return a, nil
	}
	d := dec{b: b[3:]}
	a.ReasonCode = b[2]
	a.Props = d.trailer(TypeName(p.Type))
	return a, d.validate(a.Props)
}

// Disconnect is a decoded DISCONNECT.
type Disconnect struct {
	ReasonCode byte          // 0 (normal) in 3.1.1 and when absent
	Props      RawProperties // MQTT 5; nil when absent
}

// DecodeDisconnect decodes a DISCONNECT. A 3.1.1 DISCONNECT's body is
// ignored.
func DecodeDisconnect(version byte, p Packet) (Disconnect, error) {
	if err := expect(p, TypeDisconnect); err != nil {
		return Disconnect{}, err
	}
	d := dec{b: p.Body}
	var m Disconnect
	if version == Version5 && len(d.b) > 0 {
		m.ReasonCode = d.byte1("reason code")
		m.Props = d.trailer("DISCONNECT")
	}
	return m, d.validate(m.Props)
}

// dec reads MQTT fields from the front of b; the first failure sticks and
// names what was short.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = malformed("%s runs past the end", what)
	}
	d.b = nil
}

func (d *dec) byte1(what string) byte {
	if len(d.b) < 1 {
		d.fail(what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) u16(what string) uint16 {
	if len(d.b) < 2 {
		d.fail(what)
		return 0
	}
	v := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return v
}

func (d *dec) varint(what string) int {
	n, size, err := ReadVarint(d.b)
	if err != nil {
		if d.err == nil {
			d.err = malformed("%s: not a variable byte integer", what)
		}
		d.b = nil
		return 0
	}
	d.b = d.b[size:]
	return n
}

func (d *dec) bytesN(n int, what string) []byte {
	if len(d.b) < n {
		d.fail(what)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// properties reads a property block (its length, then the block) from d.
func (d *dec) properties() RawProperties {
	n := d.varint("property length")
	return RawProperties(d.bytesN(n, "property block"))
}

// expect returns an error unless p is of one of the types.
func expect(p Packet, types ...byte) error {
	for _, t := range types {
		if p.Type == t {
			return nil
		}
	}
	return malformed("expected %s, got %s", TypeName(types[0]), TypeName(p.Type))
}

// trailer reads an optional property block that must end the body: absent
// when d is empty.
func (d *dec) trailer(what string) RawProperties {
	if len(d.b) == 0 || d.err != nil {
		return nil
	}
	props := d.properties()
	if d.err == nil && len(d.b) > 0 {
		d.err = malformed("%d bytes after the properties of %s", len(d.b), what)
	}
	return props
}

// validate returns d's error, or the properties' if they are malformed.
func (d *dec) validate(props RawProperties) error {
	if d.err != nil {
		return d.err
	}
	return props.Validate()
}
