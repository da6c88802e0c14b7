package persistence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	bolt "go.etcd.io/bbolt"

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
	"github.com/keyline-mq/keyline/sessionstore/storetest"
)

// TestSessionRecords runs the session store contract against the data
// file's records (one node: the suite's two stores are one), and its
// durability part across a close and a reopen of the file.
func TestSessionRecords(t *testing.T) {
	storetest.Run(t, func(t *testing.T) []sessionstore.Store {
		s := openSessions(t, openTestDB(t, t.TempDir(), Options{NoSync: true}))
		return []sessionstore.Store{s.Records(), s.Records()}
	})
	storetest.RunDurable(t, func(t *testing.T) func() sessionstore.Store {
		dir := t.TempDir()
		var db *DB
		t.Cleanup(func() {
			if db != nil {
				db.Close()
			}
		})
		return func() sessionstore.Store {
			if db != nil {
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			if db, err = Open(dir, Options{Logger: testLogger(t)}); err != nil {
				t.Fatal(err)
			}
			s, err := db.OpenSessions()
			if err != nil {
				t.Fatal(err)
			}
			return s.Records()
		}
	})
}

func openSessions(t *testing.T, db *DB) *SessionStore {
	t.Helper()
	s, err := db.OpenSessions()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSessionRecordsUnreadable: a record that cannot be decoded costs
// only itself. ForEach hands out every other record (across its read
// batches) and then names the first bad one and counts the rest; Load of a
// bad one is ErrCorrupt; a record in data format 3's bytes, written as
// keylines since format 3 did, reads back.
func TestSessionRecordsUnreadable(t *testing.T) {
	db := openTestDB(t, t.TempDir(), Options{NoSync: true})
	recs := openSessions(t, db).Records()
	bad := map[string][]byte{
		"k0000": {0xff, 1, 2},
		"k1023": sessionrec.Encode(&sessionstore.Record{ClientID: "k1023", State: []byte("x")}, 1)[:2],
		"k1099": []byte(`{"id":"k1099"}`),
	}
	// data format 3's bytes of a record at revision 129 (as written before
	// the codec moved to internal/sessionrec)
	old := []byte{0x1, 0x81, 0x1, 0x3, 0x2, 0x6e, 0x31, 0xac, 0x2, 0x2, 0xad, 0x2,
		0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0x9, 0x7b, 0x22, 0x61, 0x22, 0x3a, 0x31, 0x7d}
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		b := recordsBucket(tx)
		for i := range 1100 {
			id := fmt.Sprintf("k%04d", i)
			v := bad[id]
			if v == nil {
				v = sessionrec.Encode(&sessionstore.Record{ClientID: id, Owner: "n", Floor: uint64(i)}, uint64(i+1))
			}
			if err := b.Put([]byte(id), v); err != nil {
				return err
			}
		}
		return b.Put([]byte("dev-1"), old)
	})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	err = recs.ForEach(context.Background(), func(rec *sessionstore.Record, rev uint64) bool {
		if rec.ClientID != "dev-1" && (rec.Floor+1 != rev || rec.ClientID != fmt.Sprintf("k%04d", rec.Floor)) {
			t.Errorf("record %+v at revision %d", rec, rev)
		}
		seen = append(seen, rec.ClientID)
		return true
	})
	if !errors.Is(err, sessionrec.ErrCorrupt) || !strings.Contains(err.Error(), `"k0000"`) || !strings.Contains(err.Error(), "2 more") {
		t.Fatalf("ForEach: %v, want ErrCorrupt naming k0000 and 2 more", err)
	}
	if len(seen) != 1098 || slices.Contains(seen, "k1023") || !slices.IsSorted(seen) || seen[len(seen)-1] != "k1098" {
		t.Fatalf("ForEach handed out %d records (want 1098, in id order, without the bad ones): %q ... %q", len(seen), seen[:3], seen[len(seen)-3:])
	}
	for id := range bad {
		if rec, _, err := recs.Load(context.Background(), id); !errors.Is(err, sessionrec.ErrCorrupt) || !strings.Contains(err.Error(), id) {
			t.Errorf("Load(%s): %+v %v", id, rec, err)
		}
	}
	want := &sessionstore.Record{ClientID: "dev-1", Owner: "n1", Persistent: true, Connected: true, Floor: 300,
		Acked: []uint64{301, 1 << 40}, DisconnectedAt: -5, State: []byte(`{"a":1}`)}
	if rec, rev, err := recs.Load(context.Background(), "dev-1"); err != nil || rev != 129 || !reflect.DeepEqual(rec, want) {
		t.Fatalf("the format 3 record: %+v rev %d %v", rec, rev, err)
	}
}

// TestCheckNamesUnreadableSessionRecords: keyline check reports the
// session records the broker would start without, by client id, and only
// those.
func TestCheckNamesUnreadableSessionRecords(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir, Options{NoSync: true})
	recs := openSessions(t, db).Records()
	for _, id := range []string{"a", "b"} {
		if _, err := recs.Save(context.Background(), &sessionstore.Record{ClientID: id, Persistent: true}, 0); err != nil {
			t.Fatal(err)
		}
	}
	err := db.bolt.Update(func(tx *bolt.Tx) error { return recordsBucket(tx).Put([]byte("bad"), []byte{1, 1, 0x80}) })
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := CheckDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], `session record of "bad"`) || rep.Sessions[KindRecords] != 3 {
		t.Fatalf("check: problems %q, sessions %v", rep.Problems, rep.Sessions)
	}
}

// TestMigratesFormat2Sessions writes session records the way keylines of
// data format 2 did (mochi's JSON records, under the hook's keys), marks
// the file format 2 and opens it: each session is one record holding its
// client and subscriptions, the old buckets are gone, a subscription of no
// client is dropped, and the file records format 3.
func TestMigratesFormat2Sessions(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir, Options{NoSync: true})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	want := map[string]*sessionstate.State{}
	b, err := bolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(sessionsBucket)
		if err != nil {
			return err
		}
		cb, _ := root.CreateBucketIfNotExists(legacyClients)
		sb, _ := root.CreateBucketIfNotExists(legacySubscriptions)
		for i := range 50 {
			id := fmt.Sprintf("dev-%d", i)
			st := &sessionstate.State{Client: storage.Client{ID: id, T: storage.ClientKey, Listener: "tcp", ProtocolVersion: 5,
				Username: []byte("u"), Properties: storage.ClientProperties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true}}}
			raw, _ := st.Client.MarshalBinary()
			if err := cb.Put([]byte(id), raw); err != nil {
				return err
			}
			for j := range i % 4 {
				sub := storage.Subscription{T: storage.SubscriptionKey, ID: fmt.Sprintf("t/%d/#", j), Client: id, Filter: fmt.Sprintf("t/%d/#", j), Qos: 1, Identifier: j}
				st.Subs = append(st.Subs, sessionstate.Sub{Subscription: sub})
				raw, _ := json.Marshal(sub)
				key := append(append([]byte{byte(len(id))}, id...), sub.Filter...)
				if err := sb.Put(key, raw); err != nil {
					return err
				}
			}
			want[id] = st
		}
		orphan, _ := json.Marshal(storage.Subscription{Client: "gone", Filter: "x"})
		if err := sb.Put(append([]byte{4}, "gonex"...), orphan); err != nil {
			return err
		}
		return putFormat(tx, 2)
	})
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	// keyline check reads a format 2 file as it is.
	if rep, err := CheckDir(dir); err != nil || rep.Format != 2 || rep.Sessions["clients"] != 50 || rep.Sessions["subscriptions"] != 74 || len(rep.Problems) != 0 {
		t.Fatalf("check of the format 2 file: %+v %v", rep, err)
	}
	db = openTestDB(t, dir, Options{NoSync: true})
	got := map[string]*sessionstate.State{}
	if err := openSessions(t, db).Records().ForEach(context.Background(), func(rec *sessionstore.Record, rev uint64) bool {
		st, err := sessionstate.Decode(rec.ClientID, rec.State)
		if err != nil || !rec.Persistent || rev == 0 {
			t.Errorf("%s: %+v rev %d: %v", rec.ClientID, rec, rev, err)
			return true
		}
		got[rec.ClientID] = st
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("migrated %d sessions, want %d: %v", len(got), len(want), got)
	}
	err = db.bolt.View(func(tx *bolt.Tx) error {
		if v, err := formatOf(tx); err != nil || v != FormatVersion {
			return fmt.Errorf("format %d %v", v, err)
		}
		root := tx.Bucket(sessionsBucket)
		if root.Bucket(legacyClients) != nil || root.Bucket(legacySubscriptions) != nil {
			return fmt.Errorf("the format 2 buckets are still there")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A backup of the migrated file restores format 3, and check reads it.
	var buf bytes.Buffer
	if m, _, err := db.Backup(&buf); err != nil || m.DataFormat != FormatVersion {
		t.Fatalf("backup: %+v %v", m, err)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	if _, err := ExtractBackup(&buf, restored); err != nil {
		t.Fatal(err)
	}
	if rep, err := CheckDir(restored); err != nil || rep.Format != FormatVersion || rep.Sessions[KindRecords] != 50 || len(rep.Problems) != 0 {
		t.Fatalf("check of the restored backup: %+v %v", rep, err)
	}
}

// checkV1Session checks offline-1's session converted from the format 1
// fixture: an MQTT 5 client with a day's expiry subscribed to queued/# at QoS 1.
func checkV1Session(t *testing.T, s sessionstore.Store) {
	t.Helper()
	rec, rev, err := s.Load(context.Background(), "offline-1")
	if err != nil || rec == nil || rev == 0 {
		t.Fatalf("offline-1: %+v %d %v", rec, rev, err)
	}
	st, err := sessionstate.Decode(rec.ClientID, rec.State)
	if err != nil {
		t.Fatal(err)
	}
	if st.Client.ProtocolVersion != 5 || st.Client.Properties.SessionExpiryInterval != 86400 ||
		len(st.Subs) != 1 || st.Subs[0].Filter != "queued/#" || st.Subs[0].Qos != 1 || st.Subs[0].Client != "offline-1" {
		t.Fatalf("offline-1: %+v", st)
	}
}
