package hooks

import (
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	bolt "go.etcd.io/bbolt"

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
	h := NewStorage(server, store, store.Records(), nil)
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

// openStorage opens the data file in dir and a storage hook over it that
// logs to the test.
func openStorage(t *testing.T, dir string) (*persistence.DB, *Storage) {
	t.Helper()
	db, err := persistence.Open(dir, persistence.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	store, err := db.OpenSessions()
	if err != nil {
		t.Fatal(err)
	}
	h := NewStorage(mqtt.New(&mqtt.Options{}), store, store.Records(), nil)
	h.Log = slog.New(slog.NewTextHandler(t.Output(), nil))
	return db, h
}

// TestStorageSessionRecords: a persistent session's client and
// subscriptions are one session record, durable when the hook returns:
// what a new hook on the reopened file restores is what was subscribed and
// not unsubscribed; a clean start keeps the client and drops the
// subscriptions; expiry deletes the record.
func TestStorageSessionRecords(t *testing.T) {
	dir := t.TempDir()
	open := func() (*persistence.DB, *Storage) { return openStorage(t, dir) }
	restored := func(h *Storage) (map[string]bool, map[string]byte) {
		t.Helper()
		clients, err := h.StoredClients()
		if err != nil {
			t.Fatal(err)
		}
		subs, err := h.StoredSubscriptions()
		if err != nil {
			t.Fatal(err)
		}
		cs, ss := map[string]bool{}, map[string]byte{}
		for _, c := range clients {
			cs[c.ID] = c.ProtocolVersion == 5 && c.Properties.SessionExpiryInterval == 60 && string(c.Username) == "u"
		}
		for _, s := range subs {
			ss[s.Client+" "+s.Filter] = s.Qos
		}
		return cs, ss
	}
	db, h := open()
	cl := h.server.NewClient(nil, "t", "dev", false)
	cl.Properties.ProtocolVersion, cl.Properties.Username = 5, []byte("u")
	cl.Properties.Props.SessionExpiryInterval = 60
	h.OnSessionEstablished(cl, packets.Packet{})
	sub := func(filter string, qos byte) {
		h.OnSubscribed(cl, packets.Packet{Filters: packets.Subscriptions{{Filter: filter, Qos: qos}}}, []byte{qos})
	}
	sub("a/#", 1)
	sub("b/+", 0)
	sub("a/#", 2) // a new subscription to a filter replaces the old one
	h.OnUnsubscribed(cl, packets.Packet{Filters: packets.Subscriptions{{Filter: "b/+"}}})
	sub("c", 1)
	if err := db.Close(); err != nil { // no Sync: what the hooks returned from is committed
		t.Fatal(err)
	}

	db, h = open()
	cs, ss := restored(h)
	if len(cs) != 1 || !cs["dev"] || len(ss) != 2 || ss["dev a/#"] != 2 || ss["dev c"] != 1 {
		t.Fatalf("restored clients %v subscriptions %v", cs, ss)
	}
	cl.Properties.Clean = true // a clean start of a persistent session
	h.OnSessionEstablished(cl, packets.Packet{})
	if cs, ss = restored(h); len(cs) != 1 || len(ss) != 0 {
		t.Fatalf("after a clean start: clients %v subscriptions %v", cs, ss)
	}
	h.OnClientExpired(cl)
	if cs, ss = restored(h); len(cs) != 0 || len(ss) != 0 {
		t.Fatalf("after expiry: clients %v subscriptions %v", cs, ss)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStorageUnreadableRecord: a session record that cannot be decoded
// costs only its own session. The others are restored (mochi starts:
// StoredClients is no error), and the client's next session replaces it.
func TestStorageUnreadableRecord(t *testing.T) {
	dir := t.TempDir()
	open := func() (*persistence.DB, *Storage) { return openStorage(t, dir) }
	establish := func(h *Storage, id string) {
		cl := h.server.NewClient(nil, "t", id, false)
		cl.Properties.ProtocolVersion = 4
		h.OnSessionEstablished(cl, packets.Packet{})
	}
	restored := func(h *Storage) []string {
		t.Helper()
		clients, err := h.StoredClients()
		if err != nil {
			t.Fatalf("StoredClients: %v", err)
		}
		var ids []string
		for _, c := range clients {
			ids = append(ids, c.ID)
		}
		return ids
	}
	db, h := open()
	for _, id := range []string{"a", "b", "c"} {
		establish(h, id)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := bolt.Open(filepath.Join(dir, persistence.FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("sessions")).Bucket([]byte(persistence.KindRecords)).Put([]byte("b"), []byte{1, 7, 0x40})
	})
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	db, h = open()
	t.Cleanup(func() { _ = db.Close() })
	if got := restored(h); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("restored %q, want a and c", got)
	}
	establish(h, "b")
	if got := restored(h); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("after b's new session: restored %q", got)
	}
}
