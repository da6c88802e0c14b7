package hooks

import (
	"bytes"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/frame"
)

// decodeEdited decodes a frame as one connection would write it.
func decodeEdited(t *testing.T, p *frame.Publish, e frame.Edit) packets.Packet {
	t.Helper()
	out, tail := p.AppendEdited(nil, &e, true)
	pk, err := decodeFrame(&frame.Publish{B: append(out, tail...), Version: p.Version})
	if err != nil {
		t.Fatal(err)
	}
	return pk
}

func TestEncodeFrameKeepsExpiryAndProperties(t *testing.T) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
		TopicName:   "sensors/t1", Payload: []byte("21.5"), PacketID: 9,
		Expiry: time.Now().Unix() + 60,
		Properties: packets.Properties{
			ResponseTopic: "reply/x", CorrelationData: []byte{1, 2},
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

func TestMethodSet(t *testing.T) {
	s := methods(0, 5, 63, 64, 200, 255)
	for m := range 256 {
		want := m == 0 || m == 5 || m == 63 || m == 64 || m == 200 || m == 255
		if s.has(byte(m)) != want {
			t.Errorf("has(%d) = %v", m, !want)
		}
	}
}
