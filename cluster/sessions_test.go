package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/sessionstore"
	"github.com/keyline-mq/keyline/sessionstore/storetest"
)

// TestSessionStore runs the contract suite of sessionstore.Store (the one
// the in-memory store runs) against the nodes' session bucket: for each
// subtest a fresh 3-server NATS cluster (replicas 3) and two nodes on
// different servers, so that a write through one is read through the other.
func TestSessionStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) []sessionstore.Store {
		nc := natstest.Start(t, 3)
		urls := nc.URLs()
		a, _ := startNodeCfg(t, Config{URLs: urls[:1], NodeID: "node-a", Replicas: 3})
		b, _ := startNodeCfg(t, Config{URLs: urls[1:2], NodeID: "node-b", Replicas: 3})
		return []sessionstore.Store{a.SessionStore(), b.SessionStore()}
	})
}

// sessionFull sets every field of a record.
func sessionFull(id string) *sessionstore.Record {
	return &sessionstore.Record{ClientID: id, Owner: "node-a", Persistent: true, Connected: true, Floor: 1 << 40,
		Acked: []uint64{1<<40 + 3, 1<<40 + 9}, DisconnectedAt: 1700000000, State: []byte(`{"client":{"id":"` + id + `"}}`)}
}

// TestSessionRecordsBinary: the bucket keeps a record in sessionrec's form
// with its client id (the key is a hash of it), and every field reads back.
func TestSessionRecordsBinary(t *testing.T) {
	n, _ := startNode(t, natstest.Start(t, 1).URLs(), "node-a")
	ctx := context.Background()
	s := n.SessionStore()
	rec := sessionFull("dev-1")
	rev, err := s.Save(ctx, rec, 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := n.kv.Get(ctx, sessionKey("dev-1"))
	if err != nil {
		t.Fatal(err)
	}
	if v := e.Value(); len(v) == 0 || v[0] != sessionrec.Version {
		t.Fatalf("stored %q, want sessionrec's form", v)
	}
	if got, _, err := sessionrec.DecodeWithID(e.Value()); err != nil || !reflect.DeepEqual(got, rec) {
		t.Fatalf("the stored value decodes as %+v %v", got, err)
	}
	if got, grev, err := s.Load(ctx, "dev-1"); err != nil || grev != rev || !reflect.DeepEqual(got, rec) {
		t.Fatalf("Load: %+v rev %d %v, want %+v rev %d", got, grev, err, rec, rev)
	}
}

// TestSessionRecordsJSON: records written as JSON by keylines before the
// binary form (a cluster upgraded node by node) read back through Load and
// ForEach, and a Save at their revision replaces them with the binary form.
func TestSessionRecordsJSON(t *testing.T) {
	n, _ := startNode(t, natstest.Start(t, 1).URLs(), "node-a")
	ctx := context.Background()
	s := n.SessionStore()
	want := map[string]*sessionstore.Record{}
	revs := map[string]uint64{}
	for _, id := range []string{"old-1", "old-2"} {
		rec := sessionFull(id)
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if revs[id], err = n.kv.Put(ctx, sessionKey(id), data); err != nil {
			t.Fatal(err)
		}
		want[id] = rec
	}
	if _, err := s.Save(ctx, sessionFull("new-1"), 0); err != nil {
		t.Fatal(err)
	}
	want["new-1"] = sessionFull("new-1")
	got := map[string]*sessionstore.Record{}
	if err := s.ForEach(ctx, func(rec *sessionstore.Record, rev uint64) bool {
		got[rec.ClientID] = rec
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ForEach: %+v\nwant %+v", got, want)
	}
	rec, rev, err := s.Load(ctx, "old-1")
	if err != nil || rev != revs["old-1"] || !reflect.DeepEqual(rec, want["old-1"]) {
		t.Fatalf("Load of a JSON record: %+v rev %d %v", rec, rev, err)
	}
	rec.Floor++
	if _, err := s.Save(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	if e, err := n.kv.Get(ctx, sessionKey("old-1")); err != nil || e.Value()[0] != sessionrec.Version {
		t.Fatalf("after a Save: %v, want the binary form", err)
	}
	if got, _, err := s.Load(ctx, "old-1"); err != nil || !reflect.DeepEqual(got, rec) {
		t.Fatalf("Load after the Save: %+v %v", got, err)
	}
}

// TestSessionRecordsUnreadable: a value that is no record (garbage, bad
// JSON, a record under another client's key) is skipped by ForEach, which
// hands out the others and then names the first bad key; Load of one is
// ErrCorrupt with the entry's revision, and a Save at it replaces it.
func TestSessionRecordsUnreadable(t *testing.T) {
	n, _ := startNode(t, natstest.Start(t, 1).URLs(), "node-a")
	ctx := context.Background()
	s := n.SessionStore()
	for _, id := range []string{"good-1", "good-2"} {
		if _, err := s.Save(ctx, sessionFull(id), 0); err != nil {
			t.Fatal(err)
		}
	}
	bad := map[string][]byte{
		sessionKey("garbage"):   {0x01, 0x00, 0xf0},
		sessionKey("bad-json"):  []byte(`{"id":"bad-json",`),
		sessionKey("elsewhere"): encodeSession(sessionFull("someone-else")),
	}
	revs := map[string]uint64{}
	for key, v := range bad {
		rev, err := n.kv.Put(ctx, key, v)
		if err != nil {
			t.Fatal(err)
		}
		revs[key] = rev
	}
	var seen []string
	err := s.ForEach(ctx, func(rec *sessionstore.Record, _ uint64) bool {
		seen = append(seen, rec.ClientID)
		return true
	})
	slices.Sort(seen)
	if !slices.Equal(seen, []string{"good-1", "good-2"}) {
		t.Fatalf("ForEach handed out %q, want good-1 and good-2", seen)
	}
	if !errors.Is(err, sessionrec.ErrCorrupt) || !strings.Contains(err.Error(), "2 more") {
		t.Fatalf("ForEach: %v, want ErrCorrupt with 2 more", err)
	}
	named := false
	for key := range bad {
		named = named || strings.Contains(err.Error(), key)
	}
	if !named {
		t.Fatalf("ForEach's error names none of the bad keys: %v", err)
	}
	for _, id := range []string{"garbage", "bad-json"} {
		rec, rev, err := s.Load(ctx, id)
		if !errors.Is(err, sessionrec.ErrCorrupt) || rev != revs[sessionKey(id)] || !strings.Contains(err.Error(), sessionKey(id)) {
			t.Fatalf("Load(%s): %+v rev %d %v", id, rec, rev, err)
		}
	}
	if _, _, err := s.Load(ctx, "elsewhere"); err == nil || !strings.Contains(err.Error(), "collision") {
		t.Fatalf("Load of another client's record: %v", err)
	}
	rec, rev, _ := s.Load(ctx, "garbage")
	if rec != nil {
		t.Fatalf("Load of garbage returned %+v", rec)
	}
	if _, err := s.Save(ctx, sessionFull("garbage"), rev); err != nil {
		t.Fatalf("replacing the garbage: %v", err)
	}
	if got, _, err := s.Load(ctx, "garbage"); err != nil || !reflect.DeepEqual(got, sessionFull("garbage")) {
		t.Fatalf("after replacing: %+v %v", got, err)
	}
}
