package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/sessionstore"
)

// TestOrphanSweep runs the orphan sweep over an in-memory session store
// (the contract it relies on is sessionstore's) and a fake of which nodes
// answer: no NATS. The same rules run end to end in broker's
// TestClusterSweepsOrphanedSessions.
func TestOrphanSweep(t *testing.T) {
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
	state := func(version byte, expiry uint32) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"client":{"protocolVersion":%d,"properties":{"sessionExpiryInterval":%d,"sessionExpiryIntervalFlag":true}}}`, version, expiry))
	}
	for _, rec := range []sessionstore.Record{
		{ClientID: "expired", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-100 * time.Second).Unix(), State: state(5, 10)},
		{ClientID: "young", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-100 * time.Second).Unix(), State: state(5, 3600)},
		{ClientID: "clean", Owner: "node-gone", Connected: true},
		{ClientID: "v311", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-6 * 24 * time.Hour).Unix(), State: state(4, 0)},
		{ClientID: "v311-old", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-8 * 24 * time.Hour).Unix(), State: state(4, 0)},
		{ClientID: "was-connected", Owner: "node-gone", Persistent: true, Connected: true, State: state(5, 10)},
		{ClientID: "unreadable", Owner: "node-gone", Persistent: true, State: json.RawMessage(`{`)},
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
