package hooks

import (
	"bytes"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// decodePublish reads back a frame encodeQoS0 wrote.
func decodePublish(t *testing.T, frame []byte, version byte) packets.Packet {
	t.Helper()
	var pk packets.Packet
	pk.ProtocolVersion = version
	if err := pk.FixedHeader.Decode(frame[0]); err != nil {
		t.Fatal(err)
	}
	i := 1
	for frame[i]&0x80 != 0 {
		i++
	}
	i++
	pk.FixedHeader.Remaining = len(frame) - i
	if err := pk.PublishDecode(frame[i:]); err != nil {
		t.Fatal(err)
	}
	return pk
}

func TestEncodeQoS0KeepsExpiryAndProperties(t *testing.T) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
		TopicName:   "sensors/t1", Payload: []byte("21.5"), PacketID: 9,
		Expiry: time.Now().Unix() + 60,
		Properties: packets.Properties{
			ResponseTopic: "reply/x", CorrelationData: []byte{1, 2},
			User: []packets.UserProperty{{Key: "key", Val: "dev-1"}}, TopicAlias: 3, TopicAliasFlag: true,
		},
	}
	frame, err := encodeQoS0(pk, 5, false, []int{4})
	if err != nil {
		t.Fatal(err)
	}
	got := decodePublish(t, frame, 5)
	p := got.Properties
	switch {
	case got.FixedHeader.Qos != 0 || got.FixedHeader.Retain || got.PacketID != 0:
		t.Fatalf("header %+v id %d", got.FixedHeader, got.PacketID)
	case p.MessageExpiryInterval < 58 || p.MessageExpiryInterval > 60:
		t.Fatalf("expiry interval %d, want the remaining ~60 s", p.MessageExpiryInterval)
	case p.ResponseTopic != "reply/x" || !bytes.Equal(p.CorrelationData, []byte{1, 2}):
		t.Fatalf("response info dropped: %+v", p)
	case len(p.User) != 1 || p.TopicAliasFlag || len(p.SubscriptionIdentifier) != 1 || p.SubscriptionIdentifier[0] != 4:
		t.Fatalf("properties %+v", p)
	}
	// An expiry already passed still gives 1 s, never 0 (which means none).
	pk.Expiry = time.Now().Unix() - 5
	frame, _ = encodeQoS0(pk, 5, false, nil)
	if got := decodePublish(t, frame, 5); got.Properties.MessageExpiryInterval != 1 {
		t.Fatalf("expired: interval %d", got.Properties.MessageExpiryInterval)
	}
	// 3.1.1 frames carry no properties.
	frame, _ = encodeQoS0(pk, 3, true, nil)
	if got := decodePublish(t, frame, 4); !got.FixedHeader.Retain || string(got.Payload) != "21.5" {
		t.Fatalf("v3 frame %+v", got)
	}
}

func TestFitsHonoursMaximumPacketSize(t *testing.T) {
	cl := &mqtt.Client{}
	frame := make([]byte, 100)
	if !fits(cl, frame) {
		t.Fatal("no limit set")
	}
	cl.Properties.Props.MaximumPacketSize = 100
	if !fits(cl, frame) {
		t.Fatal("exactly at the limit")
	}
	cl.Properties.Props.MaximumPacketSize = 99
	if fits(cl, frame) {
		t.Fatal("over the limit")
	}
}
