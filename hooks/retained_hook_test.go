package hooks

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// failingRetained is a RetainedStore that refuses every message.
type failingRetained struct{ expired []string }

func (*failingRetained) Retain(context.Context, packets.Packet) error { return errors.New("disk full") }
func (*failingRetained) CatchUp(context.Context) error                { return nil }
func (f *failingRetained) Expired(topic string)                       { f.expired = append(f.expired, topic) }

// TestRetainedRefusesWhatItCannotStore: a retained message the store
// refuses fails the publisher's acknowledgement (MQTT 5: 0x80 on that ack
// only) or, for 3.1.1, which cannot refuse a publish, ends its connection;
// an expiry reaches the store. The hook needs nothing but a RetainedStore.
func TestRetainedRefusesWhatItCannotStore(t *testing.T) {
	server := mqtt.New(nil)
	h := NewRetained(server)
	h.SetOpts(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	store := &failingRetained{}
	h.SetStore(store, nil)
	pub := func(version byte, id uint16) (*mqtt.Client, packets.Packet) {
		cl := server.NewClient(nil, "t", "c", false)
		cl.Properties.ProtocolVersion = version
		return cl, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, TopicName: "r", Payload: []byte("x"), PacketID: id}
	}
	cl, pk := pub(5, 7)
	h.OnRetainMessage(cl, pk, 1)
	for _, c := range []struct {
		id   uint16
		want byte
	}{{8, 0}, {7, packets.ErrUnspecifiedError.Code}, {7, 0}} { // another publish's ack, this one's, then no more
		ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: c.id}
		h.EncodePacket(cl, &ack)
		if ack.ReasonCode != c.want {
			t.Fatalf("PUBACK %d: reason %#x, want %#x", c.id, ack.ReasonCode, c.want)
		}
	}
	cl3, pk3 := pub(4, 9)
	h.OnRetainMessage(cl3, pk3, 1)
	if !cl3.Closed() {
		t.Fatal("a 3.1.1 publisher whose retained message was refused is still connected")
	}
	h.OnRetainedExpired("old")
	if len(store.expired) != 1 || store.expired[0] != "old" {
		t.Fatalf("expiries told to the store: %q", store.expired)
	}
}
