package hooks

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/frame"
)

// decodePublish decodes an encoded PUBLISH for protocol version.
func decodePublish(t *testing.T, b []byte, version byte) packets.Packet {
	t.Helper()
	pk, err := decodeFrame(&frame.Publish{B: b, Version: version})
	if err != nil {
		t.Fatal(err)
	}
	return pk
}

// decodeEdited decodes a frame as one connection would write it.
func decodeEdited(t *testing.T, p *frame.Publish, e frame.Edit) packets.Packet {
	t.Helper()
	out, tail := p.AppendEdited(nil, &e, true)
	return decodePublish(t, append(out, tail...), p.Version)
}

func TestEncodeFrameKeepsExpiryAndProperties(t *testing.T) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
		TopicName:   "sensors/t1", Payload: []byte("21.5"), PacketID: 9,
		Expiry: time.Now().Unix() + 60,
		Properties: packets.Properties{
			ResponseTopic: "reply/x", CorrelationData: []byte{1, 2}, ContentType: "text/plain", PayloadFormat: 1, PayloadFormatFlag: true,
			User: []packets.UserProperty{{Key: "key", Val: "dev-1"}}, TopicAlias: 3, TopicAliasFlag: true,
		},
	}
	f, err := encodeFrame(pk, 5, false, 0, []int{4})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeFrame(f)
	if err != nil {
		t.Fatal(err)
	}
	p := got.Properties
	switch {
	case got.FixedHeader.Qos != 0 || got.FixedHeader.Retain || got.PacketID != 0:
		t.Fatalf("header %+v id %d", got.FixedHeader, got.PacketID)
	case p.MessageExpiryInterval < 58 || p.MessageExpiryInterval > 60 || f.ExpiresAt != pk.Expiry:
		t.Fatalf("expiry interval %d (expires at %d), want the remaining ~60 s", p.MessageExpiryInterval, f.ExpiresAt)
	case p.ResponseTopic != "reply/x" || !bytes.Equal(p.CorrelationData, []byte{1, 2}):
		t.Fatalf("response info dropped: %+v", p)
	case p.ContentType != "text/plain" || p.PayloadFormat != 1 || !p.PayloadFormatFlag:
		t.Fatalf("content type or payload format dropped: %+v", p)
	case len(p.User) != 1 || p.TopicAliasFlag || len(p.SubscriptionIdentifier) != 1 || p.SubscriptionIdentifier[0] != 4:
		t.Fatalf("properties %+v", p)
	}
	// An expiry already passed still gives 1 s, never 0 (which means none).
	pk.Expiry = time.Now().Unix() - 5
	f, _ = encodeFrame(pk, 5, false, 0, nil)
	if got := decodeEdited(t, f, frame.Edit{Now: time.Now().Unix()}); got.Properties.MessageExpiryInterval != 1 {
		t.Fatalf("expired: interval %d", got.Properties.MessageExpiryInterval)
	}
	// 3.1.1 frames carry no properties; QoS 1 frames get each connection's id.
	f, _ = encodeFrame(pk, 3, true, 1, nil)
	if got := decodeEdited(t, f, frame.Edit{ID: 77, Dup: true}); !got.FixedHeader.Retain || string(got.Payload) != "21.5" ||
		got.PacketID != 77 || !got.FixedHeader.Dup || got.FixedHeader.Qos != 1 || f.Version != 4 {
		t.Fatalf("v3 frame %+v id %d", got.FixedHeader, got.PacketID)
	}
}

func TestReencodeForAnotherVersion(t *testing.T) {
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2}, TopicName: "a/b", Payload: []byte("x"),
		Properties: packets.Properties{ContentType: "c"}}
	v5, err := encodeFrame(pk, 5, true, 2, []int{7})
	if err != nil {
		t.Fatal(err)
	}
	v4, err := reencode(v5, 4)
	if err != nil {
		t.Fatal(err)
	}
	got := decodeEdited(t, v4, frame.Edit{ID: 3})
	if v4.Version != 4 || got.TopicName != "a/b" || string(got.Payload) != "x" || got.FixedHeader.Qos != 2 || !got.FixedHeader.Retain || got.PacketID != 3 {
		t.Fatalf("re-encoded %+v %q", got.FixedHeader, got.TopicName)
	}
}

func TestFitsHonoursMaximumPacketSize(t *testing.T) {
	if !fits(0, 100) || !fits(100, 100) || fits(99, 100) {
		t.Fatal("fits: 0 means no limit, and the limit itself fits")
	}
}

// TestShortAckIsTheSameFrame: every ack shortAck marks encodes to the bytes
// mochi's MQTT 5 encoder writes; acks with a reason or properties stay MQTT 5.
func TestShortAckIsTheSameFrame(t *testing.T) {
	for i, typ := range []byte{packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp} {
		// mochi puts the granted QoS in its acks' reason code.
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: 0x1234, ProtocolVersion: 5, ReasonCode: byte(i % 3)}
		if typ == packets.Pubrel {
			pk.FixedHeader.Qos = 1
		}
		var v5, short bytes.Buffer
		enc := func(p packets.Packet, b *bytes.Buffer) {
			var err error
			switch typ {
			case packets.Puback:
				err = p.PubackEncode(b)
			case packets.Pubrec:
				err = p.PubrecEncode(b)
			case packets.Pubrel:
				err = p.PubrelEncode(b)
			default:
				err = p.PubcompEncode(b)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		enc(pk, &v5)
		s := pk
		shortAck(&s)
		if s.ProtocolVersion != 4 {
			t.Fatalf("type %d: not shortened", typ)
		}
		enc(s, &short)
		if !bytes.Equal(v5.Bytes(), short.Bytes()) {
			t.Fatalf("type %d: MQTT 5 % x, short % x", typ, v5.Bytes(), short.Bytes())
		}
		for _, keep := range []packets.Packet{
			{FixedHeader: pk.FixedHeader, PacketID: 1, ProtocolVersion: 5, ReasonCode: 0x80},
			{FixedHeader: pk.FixedHeader, PacketID: 1, ProtocolVersion: 5, Properties: packets.Properties{ReasonString: "no"}},
			{FixedHeader: pk.FixedHeader, PacketID: 1, ProtocolVersion: 5, Properties: packets.Properties{User: []packets.UserProperty{{Key: "a", Val: "b"}}}},
		} {
			if shortAck(&keep); keep.ProtocolVersion != 5 {
				t.Fatalf("type %d: shortened %+v", typ, keep)
			}
		}
	}
	p := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, ProtocolVersion: 5}
	if shortAck(&p); p.ProtocolVersion != 5 {
		t.Fatal("a PUBLISH was shortened")
	}
}

// TestEncodeDeliveryReadsBackAsMochiWouldWriteIt: the frames Key-Shared
// deliveries are written with decode, with mochi's decoder, to what mochi's
// WritePacket would have sent, for MQTT 3.1.1 and 5.
func TestEncodeDeliveryReadsBackAsMochiWouldWriteIt(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	m := &keyshared.Message{
		Offset: 7, Key: "dev-1", Topic: "jobs/dev-1", Payload: []byte("work"), QoS: 2,
		ExpiresAt: now.Add(90 * time.Second),
		Props: keyshared.Properties{
			PayloadFormat: 1, PayloadFormatSet: true, ContentType: "text/plain", ResponseTopic: "reply/1",
			CorrelationData: []byte{9}, User: []keyshared.UserProperty{{Key: "key", Val: "dev-1"}, {Key: "key", Val: "again"}},
		},
	}
	for _, v := range []byte{4, 5} {
		for _, qos := range []byte{1, 2} {
			frame := encodeDelivery(m, v, qos, 0x0102, []int{42}, now)
			pk := decodePublish(t, frame, v)
			if pk.TopicName != m.Topic || string(pk.Payload) != "work" || pk.FixedHeader.Qos != qos || pk.PacketID != 0x0102 ||
				pk.FixedHeader.Retain || pk.FixedHeader.Dup {
				t.Fatalf("v%d QoS %d: %+v", v, qos, pk)
			}
			p := pk.Properties
			if v == 4 {
				if p.ContentType != "" || len(p.User) != 0 {
					t.Fatalf("v4 frame carries properties: %+v", p)
				}
				continue
			}
			if p.MessageExpiryInterval != 90 || p.PayloadFormat != 1 || p.ContentType != "text/plain" || p.ResponseTopic != "reply/1" ||
				!bytes.Equal(p.CorrelationData, []byte{9}) || len(p.User) != 2 || p.User[1].Val != "again" ||
				!slices.Equal(p.SubscriptionIdentifier, []int{42}) {
				t.Fatalf("v5 QoS %d properties %+v", qos, p)
			}
		}
	}
	m.ExpiresAt = now.Add(-time.Second) // expired while waiting: at least 1 s [MQTT-3.3.2-6]
	if p := decodePublish(t, encodeDelivery(m, 5, 1, 1, nil, now), 5).Properties; p.MessageExpiryInterval != 1 {
		t.Fatalf("expiry %d, want 1", p.MessageExpiryInterval)
	}
}

// TestDeliveryLenIsTheEncodedLength: what a member's eligibility asks
// (deliveryLen) is the length of the frame it would be sent, with and
// without each property, at every QoS, for MQTT 3.1.1 and 5.
func TestDeliveryLenIsTheEncodedLength(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for i := range 256 {
		m := &keyshared.Message{Topic: "jobs/" + strings.Repeat("t", i%7*40), Payload: make([]byte, i*i%300_000), QoS: byte(i % 3)}
		if i&1 != 0 {
			m.ExpiresAt = now.Add(time.Duration(i) * time.Hour)
		}
		if i&2 != 0 {
			m.Props.ContentType, m.Props.PayloadFormat, m.Props.PayloadFormatSet = "text/plain", 1, true
		}
		if i&4 != 0 {
			m.Props.ResponseTopic, m.Props.CorrelationData = "reply/to", make([]byte, i)
		}
		for j := range i % 5 {
			m.Props.User = append(m.Props.User, keyshared.UserProperty{Key: "k", Val: strings.Repeat("v", j*50)})
		}
		var ids []int
		if i&8 != 0 {
			ids = []int{i * 1000}
		}
		for _, v := range []byte{4, 5} {
			for qos := range byte(3) {
				if got, want := deliveryLen(m, v, qos, ids), len(encodeDelivery(m, v, qos, 9, ids, now)); got != want {
					t.Fatalf("case %d v%d QoS %d: deliveryLen %d, encoded %d", i, v, qos, got, want)
				}
			}
		}
	}
}
