package hooks

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestNodeTable: the figures of other nodes, as they sent them, sorted,
// without the malformed and those not heard from for nodeStale; no NATS.
func TestNodeTable(t *testing.T) {
	var tb nodeTable
	now := time.Unix(1_800_000_000, 0)
	tb.heard([]byte(`{"node":"c","clients_connected":3}`), now)
	tb.heard([]byte(`{"node":"b","clients_connected":2}`), now.Add(-nodeStale+time.Second))
	tb.heard([]byte(`{"node":"old","clients_connected":9}`), now.Add(-nodeStale-time.Second))
	tb.heard([]byte(`{"clients_connected":1}`), now) // no node id
	tb.heard([]byte(`{`), now)
	tb.heard([]byte(`{"node":"c","clients_connected":4}`), now) // a newer report replaces
	got := tb.figures(nodeFigures{Node: "self"}, now)
	var names []string
	for _, f := range got {
		names = append(names, fmt.Sprint(f.Node, "=", f.ClientsConnected))
	}
	if !slices.Equal(names, []string{"self=0", "b=2", "c=4"}) {
		t.Fatalf("figures %q, want self first, then b and c, without the stale and the malformed", names)
	}
	if _, kept := tb.nodes["old"]; kept {
		t.Fatal("a stale node is still remembered")
	}
}
