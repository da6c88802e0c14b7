package frame

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

var seedFlag = flag.Uint64("frame.seed", 0, "seed of the randomized frame edits (0: random)")

// encode encodes pk with mochi's encoder, as the broker does.
func encode(t testing.TB, pk packets.Packet) []byte {
	t.Helper()
	var buf bytes.Buffer
	pk.Mods.AllowResponseInfo = true
	if err := pk.PublishEncode(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// decode decodes an edited frame with mochi's decoder.
func decode(t testing.TB, b []byte, version byte) packets.Packet {
	t.Helper()
	var fh packets.FixedHeader
	if err := fh.Decode(b[0]); err != nil {
		t.Fatal(err)
	}
	rem, n := uvarint(b[1:])
	if n <= 0 || 1+n+rem != len(b) {
		t.Fatalf("edited frame has remaining length %d in %d bytes", rem, len(b))
	}
	fh.Remaining = rem
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: version}
	if err := pk.PublishDecode(b[1+n:]); err != nil {
		t.Fatalf("mochi cannot decode the edited frame %x: %v", b, err)
	}
	return pk
}

func randomPacket(r *rand.Rand, version byte) (packets.Packet, int64) {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: byte(r.IntN(3)), Retain: r.IntN(2) == 0},
		TopicName:       fmt.Sprintf("t/%d/%s", r.IntN(1000), strings.Repeat("x", r.IntN(40))),
		Payload:         make([]byte, r.IntN(3000)),
		ProtocolVersion: version,
	}
	for i := range pk.Payload {
		pk.Payload[i] = byte(r.Uint32())
	}
	if pk.FixedHeader.Qos > 0 {
		pk.PacketID = uint16(r.IntN(65535) + 1)
	}
	var expiresAt int64
	if version == 5 {
		p := &pk.Properties
		if r.IntN(2) == 0 {
			p.ContentType = "text/plain"
		}
		if r.IntN(2) == 0 {
			p.PayloadFormat, p.PayloadFormatFlag = 1, true
		}
		if r.IntN(2) == 0 {
			p.ResponseTopic, p.CorrelationData = "reply/to", []byte{1, 2, 3}
		}
		if r.IntN(2) == 0 {
			expiresAt = 1_700_000_000 + int64(r.IntN(1000))
			p.MessageExpiryInterval = uint32(expiresAt - 1_700_000_000 + 5)
		}
		for range r.IntN(4) {
			key := "k"
			if r.IntN(3) == 0 {
				key = "dropped" // a publisher's own, which StripUser leaves out
			}
			p.User = append(p.User, packets.UserProperty{Key: key, Val: fmt.Sprint(r.IntN(100))})
		}
		for range r.IntN(3) {
			p.SubscriptionIdentifier = append(p.SubscriptionIdentifier, r.IntN(300000)+1)
		}
	}
	return pk, expiresAt
}

// TestEditsDecodeAsIntended encodes random PUBLISH packets with mochi,
// edits them as a connection would, and decodes the result with mochi.
func TestEditsDecodeAsIntended(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -frame.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range 3000 {
		version := byte(4)
		if r.IntN(2) == 0 {
			version = 5
		}
		pk, expiresAt := randomPacket(r, version)
		b := encode(t, pk)
		orig := slices.Clone(b)
		p, err := Parse(b, version, expiresAt)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if p.Topic != pk.TopicName || p.QoS != pk.FixedHeader.Qos || !bytes.Equal(p.Payload(), pk.Payload) {
			t.Fatalf("case %d: parsed topic %q qos %d", i, p.Topic, p.QoS)
		}
		e := Edit{ID: uint16(r.IntN(65535) + 1), Dup: r.IntN(2) == 0}
		if r.IntN(2) == 0 {
			e.Now = 1_700_000_000 + int64(r.IntN(1200))
		}
		if version == 5 && r.IntN(2) == 0 {
			e.Alias, e.AliasOnly = uint16(r.IntN(100)+1), r.IntN(2) == 0
		}
		strip := version == 5 && r.IntN(2) == 0
		if strip {
			p.StripUser(&e, "dropped")
		}
		dropped := ""
		if version == 5 && r.IntN(3) == 0 {
			dropped = fmt.Sprint(r.IntN(1000))
			e.User = AppendUserProperty(nil, "dropped", dropped)
		}
		whole := r.IntN(2) == 0
		out, tail := p.AppendEdited([]byte("prefix"), &e, whole)
		if !bytes.HasPrefix(out, []byte("prefix")) {
			t.Fatal("AppendEdited lost dst")
		}
		got := append(slices.Clone(out[6:]), tail...)
		if len(got) != p.Size(&e) {
			t.Fatalf("case %d: edited frame is %d bytes, Size says %d", i, len(got), p.Size(&e))
		}
		if !bytes.Equal(b, orig) {
			t.Fatalf("case %d: the shared frame was modified", i)
		}
		d := decode(t, got, version)
		wantTopic := pk.TopicName
		if e.AliasOnly && e.Alias != 0 {
			wantTopic = ""
		}
		switch {
		case d.TopicName != wantTopic:
			t.Fatalf("case %d: topic %q, want %q", i, d.TopicName, wantTopic)
		case !bytes.Equal(d.Payload, pk.Payload):
			t.Fatalf("case %d: payload differs", i)
		case d.FixedHeader.Qos != pk.FixedHeader.Qos || d.FixedHeader.Retain != pk.FixedHeader.Retain:
			t.Fatalf("case %d: header %+v", i, d.FixedHeader)
		case pk.FixedHeader.Qos > 0 && (d.PacketID != e.ID || d.FixedHeader.Dup != e.Dup):
			t.Fatalf("case %d: packet id %d dup %v, want %d %v", i, d.PacketID, d.FixedHeader.Dup, e.ID, e.Dup)
		case pk.FixedHeader.Qos == 0 && d.FixedHeader.Dup:
			t.Fatalf("case %d: DUP set at QoS 0", i)
		}
		if version != 5 {
			continue
		}
		dp, pp := d.Properties, pk.Properties
		wantExpiry := pp.MessageExpiryInterval
		if expiresAt > 0 && e.Now > 0 {
			wantExpiry = uint32(max(1, expiresAt-e.Now))
		}
		var wantUser []packets.UserProperty
		for _, u := range pp.User {
			if !strip || u.Key != "dropped" {
				wantUser = append(wantUser, u)
			}
		}
		if dropped != "" {
			wantUser = append(wantUser, packets.UserProperty{Key: "dropped", Val: dropped})
		}
		switch {
		case dp.MessageExpiryInterval != wantExpiry:
			t.Fatalf("case %d: expiry %d, want %d", i, dp.MessageExpiryInterval, wantExpiry)
		case dp.ContentType != pp.ContentType || dp.ResponseTopic != pp.ResponseTopic || !bytes.Equal(dp.CorrelationData, pp.CorrelationData) || dp.PayloadFormat != pp.PayloadFormat:
			t.Fatalf("case %d: properties %+v, want %+v", i, dp, pp)
		case fmt.Sprint(dp.SubscriptionIdentifier) != fmt.Sprint(pp.SubscriptionIdentifier):
			t.Fatalf("case %d: subscription ids %v, want %v", i, dp.SubscriptionIdentifier, pp.SubscriptionIdentifier)
		case fmt.Sprint(dp.User) != fmt.Sprint(wantUser):
			t.Fatalf("case %d: user properties %v, want %v", i, dp.User, wantUser)
		case dp.TopicAlias != e.Alias:
			t.Fatalf("case %d: topic alias %d, want %d", i, dp.TopicAlias, e.Alias)
		}
	}
}

func TestParseRefusesWhatIsNotOnePublish(t *testing.T) {
	good := encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "a/b", PacketID: 7, Payload: []byte("x"), ProtocolVersion: 5})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"puback":    {0x40, 2, 0, 1},
		"short":     good[:len(good)-1],
		"long":      append(slices.Clone(good), 0),
		"qos3":      append([]byte{good[0] | 0x06}, good[1:]...),
		"badvarint": {0x30, 0xff, 0xff, 0xff, 0xff},
	} {
		if _, err := Parse(b, 5, 0); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
	if _, err := Parse(good, 5, 0); err != nil {
		t.Fatal(err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(encode(f, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2}, TopicName: "a", PacketID: 3, ProtocolVersion: 5,
		Properties: packets.Properties{ContentType: "c", MessageExpiryInterval: 9, User: []packets.UserProperty{{Key: "a", Val: "b"}}}}), byte(5))
	f.Add(encode(f, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "a/b", Payload: []byte("p"), ProtocolVersion: 4}), byte(4))
	f.Fuzz(func(t *testing.T, b []byte, version byte) {
		p, err := Parse(b, version, 100)
		if err != nil {
			return
		}
		e := Edit{ID: 9, Dup: true, Now: 50, Alias: 3, User: AppendUserProperty(nil, "x", "y")}
		out, tail := p.AppendEdited(nil, &e, false)
		if len(out)+len(tail) != p.Size(&e) {
			t.Fatalf("edited size %d, Size %d", len(out)+len(tail), p.Size(&e))
		}
	})
}
