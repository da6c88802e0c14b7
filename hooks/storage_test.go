package hooks

import (
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/persistence"
)

// The server's and the client's packet ids are two spaces [MQTT-2.2.1-3]:
// the stored PUBREC of a client's QoS 2 publish with id 7 is a record of its
// own beside the server's PUBLISH 7 waiting for its PUBACK, and completing
// one flow leaves the other stored. With one key per id the PUBREC replaced
// the PUBLISH, and the client's PUBREL deleted both.
func TestStorageInflightDirectionsAreSeparate(t *testing.T) {
	db, err := persistence.Open(t.TempDir(), persistence.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store, err := db.OpenSessions()
	if err != nil {
		t.Fatal(err)
	}
	server := mqtt.New(&mqtt.Options{})
	h := NewStorage(server, store, nil)
	cl := server.NewClient(nil, "t", "dev", false)
	cl.Properties.ProtocolVersion, cl.Properties.Clean = 4, false

	stored := func() map[byte]int {
		t.Helper()
		if err := store.Sync(); err != nil {
			t.Fatal(err)
		}
		msgs, err := h.StoredInflightMessages()
		if err != nil {
			t.Fatal(err)
		}
		types := map[byte]int{}
		for _, m := range msgs {
			types[m.FixedHeader.Type]++
		}
		return types
	}
	pk := func(typ byte) packets.Packet {
		return packets.Packet{FixedHeader: packets.FixedHeader{Type: typ, Qos: 1}, PacketID: 7, TopicName: "a/b"}
	}

	h.OnQosPublish(cl, pk(packets.Publish), 1, 0) // the server's message to the client
	h.OnQosPublish(cl, pk(packets.Pubrec), 1, 0)  // the server's answer to the client's QoS 2 publish
	if got := stored(); got[packets.Publish] != 1 || got[packets.Pubrec] != 1 {
		t.Fatalf("stored in-flight entries by type: %v, want one PUBLISH and one PUBREC", got)
	}
	h.OnQosComplete(cl, pk(packets.Pubrel)) // the client's flow completes
	if got := stored(); got[packets.Publish] != 1 || len(got) != 1 {
		t.Fatalf("after the client's PUBREL: %v, want the server's PUBLISH only", got)
	}
	h.OnQosPublish(cl, pk(packets.Pubrec), 1, 0)
	h.OnQosComplete(cl, pk(packets.Puback)) // the server's flow completes
	if got := stored(); got[packets.Pubrec] != 1 || len(got) != 1 {
		t.Fatalf("after the client's PUBACK: %v, want the client's PUBREC only", got)
	}
	h.OnQosDropped(cl, pk(packets.Pubrec)) // mochi drops the in-flight entry it held
	if got := stored(); len(got) != 0 {
		t.Fatalf("after dropping the PUBREC: %v, want nothing", got)
	}
}
