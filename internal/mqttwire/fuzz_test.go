package mqttwire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// seedFrames are well-formed frames of every type the decoders read, and a
// few that are not.
func seedFrames() [][]byte {
	_, all := stream()
	return [][]byte{
		all,
		AppendPublish(nil, Version5, &Publish{Topic: "t", QoS: 2, PacketID: 5, Props: allProps, Payload: []byte("p")}),
		AppendPublish(nil, Version311, &Publish{Topic: "t/u", QoS: 1, Retain: true, PacketID: 1}),
		{TypeConnack << 4, 3, 1, 0, 0},
		append([]byte{TypeConnack << 4, byte(2 + len(AppendProperties(nil, &allProps))), 0, 0x80}, AppendProperties(nil, &allProps)...),
		{TypeSuback << 4, 6, 0, 7, 0, 0, 1, 0x80},
		{TypeUnsuback << 4, 2, 0, 7},
		AppendAck(nil, TypePuback, 3, 0x97),
		{TypePubrec<<4 | 0, 6, 0, 1, 0x80, 2, PropReasonString, 0},
		{TypePubrel<<4 | 2, 2, 0xff, 0xff},
		AppendDisconnect(nil, 0x8b),
		{TypeDisconnect << 4, 5, 0x8b, 3, PropReasonString, 0, 0},
		{TypePublish << 4, 0x80, 0x80, 0x80, 0x80, 0x01},
		{TypePublish<<4 | 6, 3, 0, 1, 'a'},
	}
}

// FuzzDecode feeds any bytes through the Reader and every decoder, for both
// versions: nothing panics, a decoded packet's properties are well formed,
// and what is decoded, encoded again, decodes to the same.
func FuzzDecode(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, herr := ParseHeader(data)
		r := NewReader(bytes.NewReader(data), 16)
		for i := 0; ; i++ {
			p, err := r.Next()
			if err != nil {
				if i == 0 && herr == nil && h.Size+h.Remaining <= len(data) {
					t.Fatalf("ParseHeader found %+v in %d bytes, Reader failed: %v", h, len(data), err)
				}
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, ErrMalformed) {
					t.Fatalf("Reader error %v", err)
				}
				return
			}
			if i == 0 && (herr != nil || p.Type != h.Type || p.Flags != h.Flags || len(p.Body) != h.Remaining) {
				t.Fatalf("Reader read %s/%d bytes, ParseHeader %+v, %v", TypeName(p.Type), len(p.Body), h, herr)
			}
			for _, v := range versions {
				checkDecoders(t, v, p)
			}
		}
	})
}

func checkDecoders(t *testing.T, v byte, p Packet) {
	valid := func(what string, props RawProperties) {
		if err := props.Validate(); err != nil {
			t.Fatalf("v%d %s decoded, but its properties are not well formed: %v", v, what, err)
		}
	}
	if c, err := DecodeConnack(v, p); err == nil {
		valid("CONNACK", c.Props)
	}
	if s, err := DecodeSuback(v, p); err == nil {
		valid("SUBACK", s.Props)
	}
	if m, err := DecodePublish(v, p); err == nil {
		valid("PUBLISH", m.Props)
		props, err := m.Props.Parse()
		if err != nil {
			t.Fatalf("v%d PUBLISH: valid properties do not parse: %v", v, err)
		}
		frame := AppendPublish(nil, v, &Publish{Topic: string(m.Topic), QoS: m.QoS, Dup: m.Dup, Retain: m.Retain,
			PacketID: m.PacketID, Props: props, Payload: m.Payload})
		m2, err := DecodePublish(v, readOne(t, frame))
		if err != nil {
			t.Fatalf("v%d PUBLISH: %v decoding % x", v, err, frame)
		}
		props2, err := m2.Props.Parse()
		if err != nil || !bytes.Equal(m2.Topic, m.Topic) || m2.QoS != m.QoS || m2.Dup != m.Dup || m2.Retain != m.Retain ||
			m2.PacketID != m.PacketID || !bytes.Equal(m2.Payload, m.Payload) || !reflect.DeepEqual(props2, props) {
			t.Fatalf("v%d PUBLISH round trip: %+v %+v became %+v %+v (%v)", v, m, props, m2, props2, err)
		}
	}
	if a, err := DecodeAck(v, p); err == nil {
		valid("ack", a.Props)
		a2, err := DecodeAck(v, readOne(t, AppendAck(nil, p.Type, a.PacketID, a.ReasonCode)))
		if err != nil || a2.PacketID != a.PacketID || a2.ReasonCode != a.ReasonCode {
			t.Fatalf("v%d %s round trip: %+v became %+v, %v", v, TypeName(p.Type), a, a2, err)
		}
	}
	if d, err := DecodeDisconnect(v, p); err == nil {
		valid("DISCONNECT", d.Props)
		d2, err := DecodeDisconnect(v, readOne(t, AppendDisconnect(nil, d.ReasonCode)))
		if err != nil || d2.ReasonCode != d.ReasonCode {
			t.Fatalf("v%d DISCONNECT round trip: %+v became %+v, %v", v, d, d2, err)
		}
	}
}

// readOne reads frame, which must be exactly one frame.
func readOne(t *testing.T, frame []byte) Packet {
	t.Helper()
	h, err := ParseHeader(frame)
	if err != nil || h.Size+h.Remaining != len(frame) {
		t.Fatalf("encoded % x: header %+v, %v", frame, h, err)
	}
	return Packet{Type: h.Type, Flags: h.Flags, Body: frame[h.Size:]}
}

// FuzzProperties checks that reading any property block never panics, that
// Validate and Parse agree, and that what parses survives a round trip.
func FuzzProperties(f *testing.F) {
	full := AppendProperties(nil, &allProps)
	f.Add(full[VarintLen(allProps.Len()):])
	f.Add([]byte{PropUserProperty, 0, 1, 'k', 0, 1, 'v', PropSubscriptionID, 0x80, 0x01})
	f.Add([]byte{PropAuthMethod, 0, 1, 'm', PropWillDelay, 0, 0, 0, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		raw := RawProperties(data)
		raw.UserValue("key")
		for r := raw; len(r) > 0; {
			p, rest, err := r.Next()
			if err != nil {
				break
			}
			p.Uint()
			r = rest
		}
		verr := raw.Validate()
		props, perr := raw.Parse()
		if (verr == nil) != (perr == nil) {
			t.Fatalf("Validate: %v, Parse: %v", verr, perr)
		}
		if perr != nil {
			if !errors.Is(perr, ErrMalformed) {
				t.Fatalf("Parse error %v does not wrap ErrMalformed", perr)
			}
			return
		}
		b := AppendProperties(nil, &props)
		if n, size, err := ReadVarint(b); err != nil || n != props.Len() || size+n != len(b) {
			t.Fatalf("block of %d bytes, length %d (%v), Len %d", len(b), n, err, props.Len())
		}
		again, err := RawProperties(b[VarintLen(props.Len()):]).Parse()
		if err != nil || !reflect.DeepEqual(again, props) {
			t.Fatalf("round trip: %+v became %+v, %v", props, again, err)
		}
	})
}
