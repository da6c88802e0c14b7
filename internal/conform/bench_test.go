package conform

import (
	"bytes"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// benchPublish is the load generator's MQTT 5 fan-in PUBLISH: QoS 0, a
// 64-byte payload, with a user property key=... (as its Key-Shared
// streams send) when key is set.
func benchPublish(key bool) []byte {
	p := &mqttwire.Publish{Topic: "bench/fanin/17", Payload: make([]byte, 64)}
	if key {
		p.Props.User = []mqttwire.UserProperty{{Key: "key", Value: "k17"}}
	}
	return mqttwire.AppendPublish(nil, mqttwire.Version5, p)
}

// BenchmarkInspect feeds a stream of PUBLISH frames to a Checker in reads of
// 2 KiB, the size mochi's bufio.Reader asks for: the cost the check adds to
// every message a client sends. ns/op is per frame.
func BenchmarkInspect(b *testing.B) {
	for _, bc := range []struct {
		name    string
		version byte
		key     bool
	}{{"v5", mqttwire.Version5, false}, {"v5-user-property", mqttwire.Version5, true}, {"v3.1.1", mqttwire.Version311, false}} {
		b.Run(bc.name, func(b *testing.B) {
			frame := benchPublish(bc.key)
			if bc.version == mqttwire.Version311 {
				frame = mqttwire.AppendPublish(nil, mqttwire.Version311, &mqttwire.Publish{Topic: "bench/fanin/17", Payload: make([]byte, 64)})
			}
			stream := bytes.Repeat(frame, 1<<16/len(frame)+1) // whole frames, frames cut across reads
			connect := mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: bc.version, ClientID: "bench", CleanStart: true})
			c := NewChecker(1 << 20)
			if _, _, err := c.Inspect(connect); err != nil {
				b.Fatal(err)
			}
			frames := len(stream) / len(frame)
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += frames {
				for off := 0; off < frames*len(frame); off += 2048 {
					if _, _, err := c.Inspect(stream[off:min(off+2048, frames*len(frame))]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkMochiDecodePublish is the yardstick for BenchmarkInspect: mochi
// decoding the same MQTT 5 frame, as it does for every PUBLISH it reads
// (without its copy of the body and the read itself).
func BenchmarkMochiDecodePublish(b *testing.B) {
	frame := benchPublish(false)
	body := frame[2:]
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		pk := packets.Packet{ProtocolVersion: 5, FixedHeader: packets.FixedHeader{Type: packets.Publish, Remaining: len(body)}}
		if err := pk.PublishDecode(body); err != nil {
			b.Fatal(err)
		}
	}
}
