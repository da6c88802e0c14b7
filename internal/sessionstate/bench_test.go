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

// BenchmarkClusterState compares what a takeover decodes of a cluster
// session record's state: the codec's bytes against the JSON cluster mode
// wrote before it (a client with 3 subscriptions, one shared with key
// filters). Report: ns/op for each.
func BenchmarkClusterState(b *testing.B) {
	bin := Encode(nil, legacyState())
	for name, data := range map[string][]byte{"binary": bin, "json": []byte(legacyJSON)} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeCluster("dev-1", data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
