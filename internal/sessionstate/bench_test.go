package sessionstate

import (
	"encoding/json"
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
)

// BenchmarkRestore compares what a restart decodes per session: format 3's
// one binary record (Decode) against format 2's JSON records of the same
// client and two subscriptions (mochi's storage types, encoding/json, as
// hooks.Storage read them before). Report: ns/session for each.
func BenchmarkRestore(b *testing.B) {
	st := full()
	bin := Encode(nil, st)
	client, _ := st.Client.MarshalBinary()
	var subs [][]byte
	for _, s := range st.Subs {
		raw, _ := json.Marshal(s.Subscription)
		subs = append(subs, raw)
	}
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Decode(st.Client.ID, bin); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c storage.Client
			if err := json.Unmarshal(client, &c); err != nil {
				b.Fatal(err)
			}
			for _, raw := range subs {
				var s storage.Subscription
				if err := json.Unmarshal(raw, &s); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
