package hooks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/storage"

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// TestOrphanSweep runs the orphan sweep over an in-memory session store
// (the contract it relies on is sessionstore's) and a fake of which nodes
// answer: no NATS. The same rules run end to end in broker's
// TestClusterSweepsOrphanedSessions. The records' states are in the
// session state codec, and in the JSON older releases wrote (their
// records are read, and expire, the same).
func TestOrphanSweep(t *testing.T) {
	t.Run("binary", func(t *testing.T) {
		testOrphanSweep(t, func(version byte, expiry uint32) []byte {
			return sessionstate.Encode(nil, &sessionstate.State{Client: storage.Client{ProtocolVersion: version,
				Properties: storage.ClientProperties{SessionExpiryInterval: expiry, SessionExpiryIntervalFlag: true}}})
		}, []byte{1, 0, 5})
	})
	t.Run("JSON", func(t *testing.T) { testOrphanSweep(t, jsonState, []byte(`{`)) })
}

// jsonState is a session state as releases before the session state codec
// wrote it in cluster mode.
func jsonState(version byte, expiry uint32) []byte {
	return fmt.Appendf(nil, `{"client":{"protocolVersion":%d,"properties":{"sessionExpiryInterval":%d,"sessionExpiryIntervalFlag":true}}}`, version, expiry)
}

func testOrphanSweep(t *testing.T, state func(version byte, expiry uint32) []byte, unreadable []byte) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	records := sessionstore.NewMemory()
	asked := map[string]int{}
	o := &orphanSweep{
		records: records, self: "node-a", maxExpiry: 7 * 24 * 3600, orphans: map[string]time.Time{},
		alive: func(_ context.Context, node string) (bool, error) {
			asked[node]++
			switch node {
			case "node-b":
				return true, nil
			case "node-flaky":
				return false, errors.New("no answer")
			}
			return false, nil
		},
	}
	for _, rec := range []sessionstore.Record{
		{ClientID: "expired", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-100 * time.Second).Unix(), State: state(5, 10)},
		{ClientID: "young", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-100 * time.Second).Unix(), State: state(5, 3600)},
		{ClientID: "clean", Owner: "node-gone", Connected: true},
		{ClientID: "v311", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-6 * 24 * time.Hour).Unix(), State: state(4, 0)},
		{ClientID: "v311-old", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-8 * 24 * time.Hour).Unix(), State: state(4, 0)},
		{ClientID: "was-connected", Owner: "node-gone", Persistent: true, Connected: true, State: state(5, 10)},
		{ClientID: "unreadable", Owner: "node-gone", Persistent: true, State: unreadable},
		{ClientID: "mine", Owner: "node-a", Connected: true},
		{ClientID: "held", Owner: "node-b", Connected: true},
		{ClientID: "unknown-owner", Owner: "node-flaky", Connected: true},
	} {
		if _, err := records.Save(ctx, &rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	sweep := func(at time.Time) []string {
		t.Helper()
		deleted, err := o.run(ctx, at)
		if err == nil || err.Error() != "no answer" {
			t.Fatalf("sweep: %v, want the flaky node's error", err)
		}
		slices.Sort(deleted)
		return deleted
	}
	if got := sweep(now); !slices.Equal(got, []string{"clean", "expired", "v311-old"}) {
		t.Fatalf("first sweep deleted %q, want clean, expired and v311-old", got)
	}
	if asked["node-gone"] != 1 || asked["node-a"] != 0 {
		t.Fatalf("nodes asked %v: want each other owner once per sweep, never this node", asked)
	}
	// Connected when its node died: expires counted from when it was first
	// found orphaned.
	if got := sweep(now.Add(9 * time.Second)); len(got) != 0 {
		t.Fatalf("sweep 9 s on deleted %q, want none", got)
	}
	if got := sweep(now.Add(11 * time.Second)); !slices.Equal(got, []string{"was-connected"}) {
		t.Fatalf("sweep 11 s on deleted %q, want was-connected", got)
	}
	if got := sweep(now.Add(2 * time.Hour)); !slices.Equal(got, []string{"young"}) {
		t.Fatalf("sweep two hours on deleted %q, want young", got)
	}
	for _, id := range []string{"v311", "mine", "held", "unknown-owner", "unreadable"} {
		if rec, _, _ := records.Load(ctx, id); rec == nil {
			t.Errorf("%s: deleted, want kept", id)
		}
	}
	var remembered []string
	for id := range o.orphans {
		remembered = append(remembered, id)
	}
	slices.Sort(remembered)
	if !slices.Equal(remembered, []string{"unreadable", "v311"}) {
		t.Fatalf("orphans remembered %q, want the records of gone nodes still kept: unreadable, v311", remembered)
	}
	// A record taken over (rewritten by a live node) is forgotten as an orphan.
	rec, rev, _ := records.Load(ctx, "v311")
	rec.Owner = "node-b"
	if _, err := records.Save(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	sweep(now.Add(3 * time.Hour))
	if _, ok := o.orphans["v311"]; ok {
		t.Fatal("a session taken over by a live node is still remembered as an orphan")
	}
}

// cutWalk is a store whose ForEach hands out at most n records and then
// returns err (a read that failed part way, or records it could not decode).
type cutWalk struct {
	sessionstore.Store
	n   int
	err error
}

func (c cutWalk) ForEach(ctx context.Context, fn func(*sessionstore.Record, uint64) bool) error {
	i := 0
	if err := c.Store.ForEach(ctx, func(rec *sessionstore.Record, rev uint64) bool {
		if i == c.n {
			return false
		}
		i++
		return fn(rec, rev)
	}); err != nil {
		return err
	}
	return c.err
}

// TestOrphanSweepOverAFailedWalk: a walk cut short forgets no orphan (its
// expiry keeps counting from when it was first found); a complete walk
// that met records it could not decode does forget the orphans it did not
// see.
func TestOrphanSweepOverAFailedWalk(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	records := sessionstore.NewMemory()
	state := jsonState(5, 10)
	for _, rec := range []sessionstore.Record{
		{ClientID: "a", Owner: "node-a", Connected: true},
		{ClientID: "z-orphan", Owner: "node-gone", Persistent: true, Connected: true, State: state},
	} {
		if _, err := records.Save(ctx, &rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	o := &orphanSweep{self: "node-a", maxExpiry: 3600, orphans: map[string]time.Time{},
		alive: func(context.Context, string) (bool, error) { return false, nil }}
	sweep := func(store sessionstore.Store, at time.Time) ([]string, error) {
		o.records = store
		return o.run(ctx, at)
	}
	if got, err := sweep(records, now); err != nil || len(got) != 0 || o.orphans["z-orphan"] != now {
		t.Fatalf("first sweep: deleted %q %v, orphans %v", got, err, o.orphans)
	}
	failed := errors.New("read failed")
	if _, err := sweep(cutWalk{records, 1, failed}, now.Add(5*time.Second)); !errors.Is(err, failed) {
		t.Fatalf("the cut walk: %v", err)
	}
	if got, err := sweep(records, now.Add(11*time.Second)); err != nil || !slices.Equal(got, []string{"z-orphan"}) {
		t.Fatalf("11 s after it was found: deleted %q %v, want z-orphan (its expiry counted over the failed walk)", got, err)
	}
	// A walk that went past undecodable records saw every readable one.
	o.orphans["gone-meanwhile"] = now
	corrupt := fmt.Errorf("record k: %w", sessionrec.ErrCorrupt)
	if _, err := sweep(cutWalk{records, 10, corrupt}, now.Add(12*time.Second)); !errors.Is(err, sessionrec.ErrCorrupt) {
		t.Fatalf("the walk over a bad record: %v", err)
	}
	if _, ok := o.orphans["gone-meanwhile"]; ok {
		t.Fatal("an orphan no complete walk saw is still remembered")
	}
}

// TestOrphanSweepLeavesWills: a record of a gone node that still holds a
// will is handed to the will watch and kept, however old, until the will
// is out; one of a live node is neither.
func TestOrphanSweepLeavesWills(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	records := sessionstore.NewMemory()
	handed := map[string]string{}
	o := &orphanSweep{
		records: records, self: "node-a", maxExpiry: 3600, orphans: map[string]time.Time{},
		alive: func(_ context.Context, node string) (bool, error) { return node == "node-b", nil },
		wills: func(rec *sessionstore.Record, _ uint64, st *sessionstate.State, _ time.Time) {
			handed[rec.ClientID] = willIn(st).Topic
		},
	}
	// The will in the session state codec, and in the JSON of the releases
	// before it.
	st := &sessionstate.State{Client: storage.Client{ProtocolVersion: 5,
		Properties: storage.ClientProperties{SessionExpiryInterval: 10, SessionExpiryIntervalFlag: true}}}
	(&storedWill{Topic: "wills/x", Run: "r1"}).put(st)
	binary := sessionstate.Encode(nil, st)
	js := []byte(`{"client":{"protocolVersion":5,"properties":{"sessionExpiryInterval":10,"sessionExpiryIntervalFlag":true}},"will":{"topic":"wills/x","run":"r1"}}`)
	for _, rec := range []sessionstore.Record{
		{ClientID: "clean", Owner: "node-gone", Connected: true, State: binary},
		{ClientID: "expired", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-time.Hour).Unix(), State: binary},
		{ClientID: "clean-json", Owner: "node-gone", Connected: true, State: js},
		{ClientID: "expired-json", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-time.Hour).Unix(), State: js},
		{ClientID: "held", Owner: "node-b", Connected: true, State: binary},
	} {
		if _, err := records.Save(ctx, &rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	deleted, err := o.run(ctx, now)
	if err != nil || len(deleted) != 0 {
		t.Fatalf("sweep deleted %q (%v), want none: their wills are not out", deleted, err)
	}
	if len(handed) != 4 || handed["clean"] != "wills/x" || handed["expired"] != "wills/x" ||
		handed["clean-json"] != "wills/x" || handed["expired-json"] != "wills/x" {
		t.Fatalf("wills handed over %v, want those of clean and expired, in either encoding", handed)
	}
}
