package packets

import (
	"bytes"
	"testing"
)

// TestPropertyValidMatchesTheTable: the bit sets answer exactly what
// validPacketProperties says, for every property byte and packet type.
func TestPropertyValidMatchesTheTable(t *testing.T) {
	types := []byte{WillProperties}
	for pkt := Reserved; pkt <= Auth; pkt++ {
		types = append(types, pkt)
	}
	types = append(types, 16, 31, 32, 98, 100, 255)
	for k := 0; k < 256; k++ {
		for _, pkt := range types {
			_, want := validPacketProperties[byte(k)][pkt]
			if got := propertyValid(byte(k), pkt); got != want {
				t.Errorf("property %#x in packet type %d: valid %v, want %v", k, pkt, got, want)
			}
		}
	}
}

func BenchmarkPropertiesEncodePublish(b *testing.B) {
	p := Properties{ContentType: "text/plain", User: []UserProperty{{Key: "key", Val: "k1"}}}
	var buf bytes.Buffer
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf.Reset()
		p.Encode(Publish, Mods{}, &buf, 64)
	}
}
