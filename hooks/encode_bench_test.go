package hooks

import (
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

func BenchmarkEncodeFrame(b *testing.B) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName:   "sensors/site-1/t1", Payload: make([]byte, 64), Expiry: time.Now().Unix() + 60,
		Properties: packets.Properties{User: []packets.UserProperty{{Key: "key", Val: "dev-1"}}},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeFrame(pk, 5, false, 1, []int{3}); err != nil {
			b.Fatal(err)
		}
	}
}
