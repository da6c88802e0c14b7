package mqttwire

// The encoders are checked against mochi's decoder and the decoders against
// mochi's encoder: an independent implementation on the other side of every
// frame.

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

var versions = []byte{Version311, Version5}

// mochiDecode parses one whole frame with mochi.
func mochiDecode(t *testing.T, frame []byte, version byte) packets.Packet {
	t.Helper()
	h, err := ParseHeader(frame)
	if err != nil || h.Size+h.Remaining != len(frame) {
		t.Fatalf("frame % x: header %+v, %v; %d bytes", frame, h, err, len(frame))
	}
	pk := packets.Packet{ProtocolVersion: version}
	if err := pk.FixedHeader.Decode(frame[0]); err != nil {
		t.Fatalf("mochi: fixed header of % x: %v", frame, err)
	}
	pk.FixedHeader.Remaining = h.Remaining
	body := frame[h.Size:]
	decode := map[byte]func([]byte) error{
		packets.Connect: pk.ConnectDecode, packets.Subscribe: pk.SubscribeDecode,
		packets.Unsubscribe: pk.UnsubscribeDecode, packets.Publish: pk.PublishDecode,
		packets.Puback: pk.PubackDecode, packets.Pubrec: pk.PubrecDecode, packets.Pubrel: pk.PubrelDecode,
		packets.Pubcomp: pk.PubcompDecode, packets.Disconnect: pk.DisconnectDecode, packets.Pingreq: pk.PingreqDecode,
	}[h.Type]
	if decode == nil {
		t.Fatalf("no mochi decoder for %s", TypeName(h.Type))
	}
	if err := decode(body); err != nil {
		t.Fatalf("mochi: decode %s % x: %v", TypeName(h.Type), frame, err)
	}
	return pk
}

// mochiEncode encodes pk with mochi and reads it back as one Packet.
func mochiEncode(t *testing.T, pk packets.Packet) Packet {
	t.Helper()
	var buf bytes.Buffer
	encode := map[byte]func(*bytes.Buffer) error{
		packets.Connack: pk.ConnackEncode, packets.Publish: pk.PublishEncode, packets.Suback: pk.SubackEncode,
		packets.Unsuback: pk.UnsubackEncode, packets.Puback: pk.PubackEncode, packets.Pubrec: pk.PubrecEncode,
		packets.Pubrel: pk.PubrelEncode, packets.Pubcomp: pk.PubcompEncode, packets.Disconnect: pk.DisconnectEncode,
	}[pk.FixedHeader.Type]
	if err := encode(&buf); err != nil {
		t.Fatalf("mochi: encode %s: %v", TypeName(pk.FixedHeader.Type), err)
	}
	r := NewReader(bytes.NewReader(buf.Bytes()), 0)
	p, err := r.Next()
	if err != nil {
		t.Fatalf("reading mochi's % x: %v", buf.Bytes(), err)
	}
	if _, err := r.Next(); err == nil {
		t.Fatalf("mochi's % x holds more than one frame", buf.Bytes())
	}
	return p
}

func TestEncodeConnect(t *testing.T) {
	for _, v := range versions {
		c := &Connect{Version: v, ClientID: "client-1", CleanStart: true, KeepAlive: 30, Username: "u", Password: "p",
			Props: Properties{SessionExpiry: 3600, ReceiveMaximum: 10, MaximumPacketSize: 1 << 20,
				User: []UserProperty{{"a", "b"}}}}
		pk := mochiDecode(t, AppendConnect(nil, c), v)
		got := pk.Connect
		if pk.ProtocolVersion != v || got.ClientIdentifier != "client-1" || !got.Clean || got.Keepalive != 30 ||
			string(got.Username) != "u" || string(got.Password) != "p" || got.WillFlag {
			t.Errorf("v%d: mochi read %+v", v, got)
		}
		wantProps := packets.Properties{}
		if v == Version5 {
			wantProps = packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true, ReceiveMaximum: 10,
				MaximumPacketSize: 1 << 20, User: []packets.UserProperty{{Key: "a", Val: "b"}}}
		}
		if !reflect.DeepEqual(pk.Properties, wantProps) {
			t.Errorf("v%d: properties %+v, want %+v", v, pk.Properties, wantProps)
		}
		bare := mochiDecode(t, AppendConnect(nil, &Connect{Version: v, ClientID: "c"}), v)
		if bare.Connect.Clean || bare.Connect.UsernameFlag || bare.Connect.PasswordFlag {
			t.Errorf("v%d: bare CONNECT read as %+v", v, bare.Connect)
		}
	}
}

func TestEncodeSubscribe(t *testing.T) {
	for _, v := range versions {
		s := &Subscribe{PacketID: 7, Filters: []Subscription{{"$share/g/a/+", 1}, {"b/#", 2}},
			Props: Properties{User: []UserProperty{{"key-filter", "k*"}, {"key-filter", "j?"}}}}
		pk := mochiDecode(t, AppendSubscribe(nil, v, s), v)
		if pk.PacketID != 7 || len(pk.Filters) != 2 || pk.Filters[0].Filter != "$share/g/a/+" || pk.Filters[0].Qos != 1 ||
			pk.Filters[1].Filter != "b/#" || pk.Filters[1].Qos != 2 {
			t.Errorf("v%d: mochi read %+v", v, pk.Filters)
		}
		if want := map[byte]int{Version311: 0, Version5: 2}[v]; len(pk.Properties.User) != want {
			t.Errorf("v%d: %d user properties, want %d", v, len(pk.Properties.User), want)
		}
	}
	pk := mochiDecode(t, AppendSubscribe(nil, Version5, &Subscribe{PacketID: 1, Filters: []Subscription{{"x", 0x04 | 0x08 | 0x20 | 1}}}), Version5)
	if f := pk.Filters[0]; !f.NoLocal || !f.RetainAsPublished || f.RetainHandling != 2 || f.Qos != 1 {
		t.Errorf("subscription options read as %+v", f)
	}
}

func TestEncodeUnsubscribe(t *testing.T) {
	for _, v := range versions {
		u := &Unsubscribe{PacketID: 65535, Filters: []string{"a/+", "b"}, Props: Properties{User: []UserProperty{{"x", "y"}}}}
		pk := mochiDecode(t, AppendUnsubscribe(nil, v, u), v)
		if pk.PacketID != 65535 || len(pk.Filters) != 2 || pk.Filters[0].Filter != "a/+" || pk.Filters[1].Filter != "b" {
			t.Errorf("v%d: mochi read id %d, %+v", v, pk.PacketID, pk.Filters)
		}
	}
}

func TestEncodePublish(t *testing.T) {
	for _, v := range versions {
		for qos := byte(0); qos <= 2; qos++ {
			p := &Publish{Topic: "bench/x", QoS: qos, Retain: true, Dup: qos > 0, PacketID: uint16(qos) * 513,
				Props:   Properties{MessageExpiry: 60, ContentType: "text/plain", User: []UserProperty{{"key", "k1"}}},
				Payload: []byte("payload")}
			frame := AppendPublish(nil, v, p)
			if n := PublishLen(v, p); n != len(frame) {
				t.Errorf("v%d QoS %d: PublishLen %d, frame %d bytes", v, qos, n, len(frame))
			}
			// The frame is sized before it is written: appended to a slice
			// with exactly that much room, it stays in place.
			room := make([]byte, 1, 1+len(frame))
			if again := AppendPublish(room, v, p); &again[0] != &room[0] || !bytes.Equal(again[1:], frame) {
				t.Errorf("v%d QoS %d: the frame did not fit the room its size gave it", v, qos)
			}
			pk := mochiDecode(t, frame, v)
			if pk.TopicName != "bench/x" || pk.FixedHeader.Qos != qos || !pk.FixedHeader.Retain || pk.FixedHeader.Dup != (qos > 0) ||
				pk.PacketID != p.PacketID || string(pk.Payload) != "payload" {
				t.Errorf("v%d QoS %d: mochi read %+v", v, qos, pk)
			}
			if v == Version5 && (pk.Properties.MessageExpiryInterval != 60 || pk.Properties.ContentType != "text/plain" ||
				!slices.Equal(pk.Properties.User, []packets.UserProperty{{Key: "key", Val: "k1"}})) {
				t.Errorf("QoS %d: properties %+v", qos, pk.Properties)
			}
		}
	}
}

func TestEncodeAcks(t *testing.T) {
	for _, typ := range []byte{TypePuback, TypePubrec, TypePubrel, TypePubcomp} {
		pk := mochiDecode(t, AppendAck(nil, typ, 65535, 0), Version311)
		if pk.FixedHeader.Type != typ || pk.PacketID != 65535 {
			t.Errorf("%s: mochi read %+v", TypeName(typ), pk)
		}
		reason := byte(0x80)
		if typ == TypePubrel || typ == TypePubcomp {
			reason = 0x92 // packet identifier not found: the only failure they have
		}
		pk = mochiDecode(t, AppendAck(nil, typ, 12, reason), Version5)
		if pk.PacketID != 12 || pk.ReasonCode != reason {
			t.Errorf("%s with reason: mochi read %+v", TypeName(typ), pk)
		}
	}
	if pk := mochiDecode(t, AppendDisconnect(nil, 0), Version311); pk.FixedHeader.Type != packets.Disconnect {
		t.Errorf("DISCONNECT read as %+v", pk)
	}
	if pk := mochiDecode(t, AppendDisconnect(nil, 0x04), Version5); pk.ReasonCode != 0x04 {
		t.Errorf("DISCONNECT with will read as %+v", pk)
	}
	if pk := mochiDecode(t, AppendPingreq(nil), Version5); pk.FixedHeader.Type != packets.Pingreq {
		t.Errorf("PINGREQ read as %+v", pk)
	}
}

func TestDecodeConnack(t *testing.T) {
	for _, v := range versions {
		pk := packets.Packet{ProtocolVersion: v, FixedHeader: packets.FixedHeader{Type: packets.Connack}, SessionPresent: true, ReasonCode: 0x86,
			Properties: packets.Properties{ReceiveMaximum: 20, ServerKeepAlive: 15, ServerKeepAliveFlag: true, MaximumQos: 1, MaximumQosFlag: true,
				AssignedClientID: "assigned", ReasonString: "nope", User: []packets.UserProperty{{Key: "k", Val: "v"}}}}
		c, err := DecodeConnack(v, mochiEncode(t, pk))
		if err != nil || !c.SessionPresent || c.ReasonCode != 0x86 {
			t.Fatalf("v%d: %+v, %v", v, c, err)
		}
		props, err := c.Props.Parse()
		want := Properties{ReceiveMaximum: 20, ServerKeepAlive: 15, MaximumQoS: 1, HasMaximumQoS: true, AssignedClientID: "assigned",
			ReasonString: "nope", User: []UserProperty{{"k", "v"}}}
		if v == Version311 {
			want = Properties{}
		}
		if err != nil || !reflect.DeepEqual(props, want) {
			t.Errorf("v%d: properties %+v, %v; want %+v", v, props, err, want)
		}
	}
}

func TestDecodePublish(t *testing.T) {
	for _, v := range versions {
		for qos := byte(0); qos <= 2; qos++ {
			pk := packets.Packet{ProtocolVersion: v, FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: true, Dup: qos == 2},
				TopicName: "a/b", PacketID: uint16(qos), Payload: []byte("body"),
				Properties: packets.Properties{MessageExpiryInterval: 9, SubscriptionIdentifier: []int{3, 300},
					User: []packets.UserProperty{{Key: "other", Val: "x"}, {Key: "key", Val: "k7"}}}}
			m, err := DecodePublish(v, mochiEncode(t, pk))
			if err != nil || string(m.Topic) != "a/b" || m.QoS != qos || !m.Retain || m.Dup != (qos == 2) || m.PacketID != uint16(qos) ||
				string(m.Payload) != "body" {
				t.Fatalf("v%d QoS %d: %+v, %v", v, qos, m, err)
			}
			key, ok := m.Props.UserValue("key")
			if v == Version5 && (!ok || string(key) != "k7") || v == Version311 && ok {
				t.Errorf("v%d QoS %d: key %q, %v", v, qos, key, ok)
			}
			if v == Version5 {
				props, err := m.Props.Parse()
				if err != nil || props.MessageExpiry != 9 || !slices.Equal(props.SubscriptionIDs, []int{3, 300}) || len(props.User) != 2 {
					t.Errorf("QoS %d: properties %+v, %v", qos, props, err)
				}
			}
		}
	}
}

func TestDecodeSubackUnsuback(t *testing.T) {
	for _, v := range versions {
		for _, typ := range []byte{packets.Suback, packets.Unsuback} {
			codes := []byte{0, 1, 2, 0x80}
			if typ == packets.Unsuback {
				codes = []byte{0, 0x11}
			}
			pk := packets.Packet{ProtocolVersion: v, FixedHeader: packets.FixedHeader{Type: typ}, PacketID: 300, ReasonCodes: codes,
				Properties: packets.Properties{ReasonString: "why"}}
			s, err := DecodeSuback(v, mochiEncode(t, pk))
			if v == Version311 && typ == packets.Unsuback {
				codes = nil // 3.1.1 has no reason codes in UNSUBACK
			}
			if err != nil || s.PacketID != 300 || !bytes.Equal(s.ReasonCodes, codes) {
				t.Errorf("v%d %s: %+v, %v", v, TypeName(typ), s, err)
			}
			if props, _ := s.Props.Parse(); v == Version5 && props.ReasonString != "why" {
				t.Errorf("v%d %s: properties %+v", v, TypeName(typ), props)
			}
		}
	}
}

func TestDecodeAcks(t *testing.T) {
	for _, v := range versions {
		for _, typ := range []byte{packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp} {
			for _, rc := range []byte{0, 0x92} {
				pk := packets.Packet{ProtocolVersion: v, FixedHeader: packets.FixedHeader{Type: typ, Qos: map[bool]byte{true: 1}[typ == packets.Pubrel]},
					PacketID: 4242, ReasonCode: rc, Properties: packets.Properties{ReasonString: "r"}}
				a, err := DecodeAck(v, mochiEncode(t, pk))
				want := rc
				if v == Version311 {
					want = 0
				}
				if err != nil || a.PacketID != 4242 || a.ReasonCode != want {
					t.Errorf("v%d %s rc %#x: %+v, %v", v, TypeName(typ), rc, a, err)
				}
			}
		}
	}
	pk := packets.Packet{ProtocolVersion: 5, FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ReasonCode: 0x8b,
		Properties: packets.Properties{ReasonString: "shutting down"}}
	d, err := DecodeDisconnect(Version5, mochiEncode(t, pk))
	props, _ := d.Props.Parse()
	if err != nil || d.ReasonCode != 0x8b || props.ReasonString != "shutting down" {
		t.Errorf("DISCONNECT: %+v %+v, %v", d, props, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	pub := func(flags byte, body ...byte) Packet { return Packet{Type: TypePublish, Flags: flags, Body: body} }
	for _, tc := range []struct {
		name    string
		version byte
		decode  func(byte, Packet) error
		p       Packet
	}{
		{"publish: wrong type", 5, publishErr, Packet{Type: TypeConnack}},
		{"publish: QoS 3", 4, publishErr, pub(0x06, 0, 1, 'a')},
		{"publish: empty", 4, publishErr, pub(0)},
		{"publish: topic past the end", 4, publishErr, pub(0, 0, 9, 'a')},
		{"publish: no packet id", 4, publishErr, pub(0x02, 0, 1, 'a', 0)},
		{"publish: no property length", 5, publishErr, pub(0, 0, 1, 'a')},
		{"publish: properties past the end", 5, publishErr, pub(0, 0, 1, 'a', 5, 0x01)},
		{"publish: unknown property", 5, publishErr, pub(0, 0, 1, 'a', 2, 0x77, 0)},
		{"publish: short user property", 5, publishErr, pub(0, 0, 1, 'a', 3, 0x26, 0, 1)},
		{"connack: short", 5, connackErr, Packet{Type: TypeConnack, Body: []byte{0}}},
		{"connack: bytes after properties", 5, connackErr, Packet{Type: TypeConnack, Body: []byte{0, 0, 0, 9}}},
		{"connack: wrong type", 5, connackErr, Packet{Type: TypeSuback, Body: []byte{0, 0}}},
		{"suback: short", 4, subackErr, Packet{Type: TypeSuback, Body: []byte{0}}},
		{"suback: properties past the end", 5, subackErr, Packet{Type: TypeSuback, Body: []byte{0, 1, 4, 0x1f, 0}}},
		{"suback: wrong type", 5, subackErr, Packet{Type: TypePuback, Body: []byte{0, 1, 0}}},
		{"ack: short", 4, ackErr, Packet{Type: TypePuback, Body: []byte{1}}},
		{"ack: bad properties", 5, ackErr, Packet{Type: TypePubrec, Body: []byte{0, 1, 0x80, 2, 0x1f, 0}}},
		{"ack: wrong type", 5, ackErr, Packet{Type: TypeSuback, Body: []byte{0, 1}}},
		{"disconnect: bad properties", 5, disconnectErr, Packet{Type: TypeDisconnect, Body: []byte{0x8b, 0x80}}},
	} {
		if err := tc.decode(tc.version, tc.p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", tc.name, err)
		}
	}
}

func publishErr(v byte, p Packet) error    { _, err := DecodePublish(v, p); return err }
func connackErr(v byte, p Packet) error    { _, err := DecodeConnack(v, p); return err }
func subackErr(v byte, p Packet) error     { _, err := DecodeSuback(v, p); return err }
func ackErr(v byte, p Packet) error        { _, err := DecodeAck(v, p); return err }
func disconnectErr(v byte, p Packet) error { _, err := DecodeDisconnect(v, p); return err }

// TestDecodePublishAllocatesNothing: the load generator decodes every
// delivery with it.
func TestDecodePublishAllocatesNothing(t *testing.T) {
	frame := AppendPublish(nil, Version5, &Publish{Topic: "t", QoS: 1, PacketID: 1,
		Props: Properties{User: []UserProperty{{"key", "k"}}}, Payload: make([]byte, 64)})
	h, _ := ParseHeader(frame)
	p := Packet{Type: h.Type, Flags: h.Flags, Body: frame[h.Size:]}
	out := make([]byte, 0, 16)
	allocs := testing.AllocsPerRun(100, func() {
		m, err := DecodePublish(Version5, p)
		if v, ok := m.Props.UserValue("key"); err != nil || !ok || string(v) != "k" {
			t.Fatal("decode failed")
		}
		out = AppendAck(out[:0], TypePuback, m.PacketID, 0)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per decode", allocs)
	}
}
