package hooks

import (
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/filter"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/mochi-mqtt/server/v2/packets"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2, Retain: true},
		TopicName:   "a/b.c/ d",
		Payload:     []byte("payload"),
		Origin:      "client-1",
		Created:     1700000000,
		Expiry:      1700000100,
		PacketID:    77,
		Properties: packets.Properties{
			ContentType: "text/plain", ResponseTopic: "re/ply", CorrelationData: []byte{1, 2},
			PayloadFormat: 1, PayloadFormatFlag: true, MessageExpiryInterval: 100,
			User:       []packets.UserProperty{{Key: "key", Val: "device-7"}},
			TopicAlias: 3, TopicAliasFlag: true, SubscriptionIdentifier: []int{4},
		},
	}
	data, err := encodeEnvelope(pk)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeEnvelope(data)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case got.TopicName != pk.TopicName || string(got.Payload) != "payload" || got.Origin != "client-1":
		t.Fatalf("got %+v", got)
	case got.Created != pk.Created || got.Expiry != pk.Expiry || got.FixedHeader.Qos != 2 || !got.FixedHeader.Retain:
		t.Fatalf("header or times lost: %+v", got)
	case got.Properties.ContentType != "text/plain" || got.Properties.ResponseTopic != "re/ply" || len(got.Properties.CorrelationData) != 2:
		t.Fatalf("properties lost: %+v", got.Properties)
	case len(got.Properties.User) != 1 || got.Properties.User[0].Val != "device-7" || !got.Properties.PayloadFormatFlag:
		t.Fatalf("user properties lost: %+v", got.Properties)
	case got.Properties.TopicAlias != 0 || len(got.Properties.SubscriptionIdentifier) != 0:
		t.Fatalf("per-connection properties travelled: %+v", got.Properties)
	}
	for _, bad := range [][]byte{nil, {9}, data[:len(data)/2], append([]byte{1, 200}, data[2:]...)} {
		if _, err := decodeEnvelope(bad); err == nil {
			t.Errorf("decodeEnvelope(%x) accepted", bad)
		}
	}
}

func TestRemainingExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	pk := packets.Packet{Expiry: 1010}
	if !remainingExpiry(&pk, now) || pk.Properties.MessageExpiryInterval != 10 {
		t.Fatalf("remaining %d", pk.Properties.MessageExpiryInterval)
	}
	if pk := (packets.Packet{Expiry: 999}); remainingExpiry(&pk, now) {
		t.Fatal("expired message kept")
	}
	if pk := (packets.Packet{}); !remainingExpiry(&pk, now) {
		t.Fatal("message without expiry dropped")
	}
}

func TestTopicMatchAndSessionMatch(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/#", "a", true}, {"a/#", "a/b/c", true}, {"a/+", "a/b", true}, {"a/+", "a/b/c", false},
		{"+/b", "/b", true}, {"#", "$SYS/x", false}, {"+/x", "$a/x", false}, {"$a/#", "$a/x", true},
		{"a/b", "a/b", true}, {"a/b", "a/bc", false}, {"a//b", "a//b", true}, {"a/+/b", "a//b", true},
	} {
		if got := filter.Match(c.filter, c.topic); got != c.want {
			t.Errorf("filter.Match(%q, %q) = %v", c.filter, c.topic, got)
		}
	}
	subs := []sessionstate.Sub{{Since: 10}, {Since: 2}}
	subs[0].Filter, subs[0].Qos, subs[0].Identifier = "a/#", 2, 7
	subs[1].Filter, subs[1].Qos = "a/+", 1
	if qos, ids, ok := matchSession(subs, "a/b", 5); !ok || qos != 1 || len(ids) != 0 {
		t.Fatalf("seq 5: only the older subscription takes it: %d %v %v", qos, ids, ok)
	}
	if qos, ids, ok := matchSession(subs, "a/b", 11); !ok || qos != 2 || len(ids) != 1 || ids[0] != 7 {
		t.Fatalf("seq 11: %d %v %v", qos, ids, ok)
	}
	if _, _, ok := matchSession(subs, "b", 11); ok {
		t.Fatal("no subscription matches b")
	}
	if !strings.HasPrefix(clusterQueuedClient, "\x00") {
		t.Fatal("inline client ids must be out of reach of clients")
	}
}

// FuzzDecodeEnvelope: what another node (or any client of the NATS
// account) sends on Keyline's subjects never panics the decoder, never makes
// it allocate more than the message holds, and what it accepts encodes back
// to a message that decodes the same.
func FuzzDecodeEnvelope(f *testing.F) {
	seed, err := encodeEnvelope(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName:   "a/b", Payload: []byte("x"), Origin: "c", Created: 5, Expiry: 9,
		Properties: packets.Properties{User: []packets.UserProperty{{Key: "k", Val: "v"}}},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{envelopeVersion, 0, 0, 0, 0x30, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		pk, err := decodeEnvelope(data)
		if err != nil {
			return
		}
		if len(pk.Payload) > len(data) || len(pk.TopicName) > len(data) {
			t.Fatalf("decoded more than the input holds: topic %d, payload %d bytes of %d", len(pk.TopicName), len(pk.Payload), len(data))
		}
		again, err := encodeEnvelope(pk)
		if err != nil {
			return // a decodable message mochi's encoder refuses (too large a property): nothing is forwarded
		}
		back, err := decodeEnvelope(again)
		if err != nil {
			t.Fatalf("an accepted envelope does not decode once re-encoded: %v", err)
		}
		if back.TopicName != pk.TopicName || string(back.Payload) != string(pk.Payload) || back.Origin != pk.Origin ||
			back.FixedHeader.Qos != pk.FixedHeader.Qos || back.Created != pk.Created || back.Expiry != pk.Expiry {
			t.Fatalf("round trip changed the message: %+v, then %+v", pk, back)
		}
	})
}
