package hooks

import (
	"errors"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
)

func copyAt(id string, cl *mqtt.Client, rev uint64) *clusterSession {
	s := newClusterSession(id, cl, true)
	s.rev = rev
	return s
}

// TestSessionTableReleaseDuringAcquire is the race behind the flaky
// TestClusterConcurrentConnectsOneOwner: node A writes revision 13 for its
// new connection; before A installs that copy, node C reads 13, asks A to
// release it (upTo 13) and writes 14. A's install must fail: C owns the
// session. A release aimed at an older revision must not stop it.
func TestSessionTableReleaseDuringAcquire(t *testing.T) {
	tb := newSessionTable()
	cl := &mqtt.Client{ID: "racer"}

	tb.begin("racer")
	if s, newer := tb.claim("racer", 12); s != nil || newer {
		t.Fatalf("claim with nothing installed: %v %v", s, newer)
	}
	if err := tb.install(copyAt("racer", cl, 13), nil); err != nil {
		t.Fatalf("a release for revision 12 stopped the copy at 13: %v", err)
	}
	tb.end("racer")
	if tb.current(cl) == nil {
		t.Fatal("installed copy not current")
	}

	cl2 := &mqtt.Client{ID: "racer"}
	prev := tb.get("racer")
	tb.begin("racer")
	next := copyAt("racer", cl2, 15)
	if s, _ := tb.claim("racer", 15); s != prev {
		t.Fatalf("claim up to 15 took %v, want the copy at 13", s)
	}
	if err := tb.install(next, prev); !errors.Is(err, errSuperseded) {
		t.Fatalf("install over a release covering its revision: %v, want errSuperseded", err)
	}
	tb.end("racer")
	if tb.get("racer") != nil || tb.current(cl2) != nil {
		t.Fatal("a superseded copy was installed")
	}
}

// TestSessionTableCopiesAreNotRebound: acting on an old connection's copy
// never reaches the copy of the connection that replaced it on this node.
func TestSessionTableCopiesAreNotRebound(t *testing.T) {
	tb := newSessionTable()
	old, cur := &mqtt.Client{ID: "c"}, &mqtt.Client{ID: "c"}
	prev := copyAt("c", old, 3)
	if err := tb.install(prev, nil); err != nil {
		t.Fatal(err)
	}
	s := copyAt("c", cur, 4)
	if err := tb.install(s, copyAt("c", old, 3)); !errors.Is(err, errTableChanged) {
		t.Fatalf("install over a copy that is not the installed one: %v", err)
	}
	if err := tb.install(s, prev); err != nil {
		t.Fatal(err)
	}
	if tb.current(old) != nil {
		t.Fatal("the old connection still finds a copy")
	}
	if tb.remove(prev) || tb.removeStale(prev) {
		t.Fatal("removed the replaced copy's successor")
	}
	if got, newer := tb.claim("c", 3); got != nil || !newer {
		t.Fatalf("a release for revision 3 took the copy at 4: %v %v", got, newer)
	}
	tb.begin("c")
	if tb.removeStale(s) {
		t.Fatal("a refused write dropped the copy while an acquisition of its id is under way")
	}
	tb.end("c")
	if !tb.removeStale(s) || tb.get("c") != nil {
		t.Fatal("removeStale kept the copy")
	}
}

func TestSessionInherit(t *testing.T) {
	prev := copyAt("c", &mqtt.Client{ID: "c"}, 3)
	prev.filters["a/#"] = true
	prev.live[7] = 42
	prev.acked = []uint64{40}
	prev.replayedTo.Store(41)
	s := copyAt("c", &mqtt.Client{ID: "c"}, 4)
	s.inherit(prev)
	if !prev.released.Load() || len(prev.filters) != 0 || len(prev.live) != 0 {
		t.Fatal("prev keeps what it handed over")
	}
	if !s.filters["a/#"] || s.live[7] != 42 || len(s.acked) != 1 || s.replayedTo.Load() != 41 {
		t.Fatalf("not inherited: %+v", s)
	}
}
