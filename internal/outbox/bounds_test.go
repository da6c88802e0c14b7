package outbox

import (
	"testing"
)

// TestByteBounds: an outbox holds at most MaxBytes of frames, all outboxes
// of a Config at most MaxTotalBytes; past either a new message is dropped,
// counted and signalled, and room comes back as messages finish.
func TestByteBounds(t *testing.T) {
	size := int64(len(publish(t, 1, 1).B))
	cfg := &Config{Max: 100, MaxBytes: 3 * size, MaxTotalBytes: 5 * size}
	a, b := New("a", cfg), New("b", cfg)
	for n := range 4 {
		if got := a.Add(publish(t, 1, n), 0, 0, 0); got != (n < 3) {
			t.Fatalf("a: add %d = %v", n, got)
		}
	}
	for n := range 3 {
		if got := b.Add(publish(t, 1, n), 0, 0, 0); got != (n < 2) {
			t.Fatalf("b: add %d = %v (the total bound)", n, got)
		}
	}
	if d, bytes := cfg.Stats.Dropped.Load(), cfg.Stats.Bytes.Load(); d != 2 || bytes != 5*size {
		t.Fatalf("dropped %d, held %d bytes", d, bytes)
	}
	c := &fakeConn{}
	a.Attach(c, 0)
	if c.missed != 1 || len(c.sends) != 3 {
		t.Fatalf("a's connection: missed %d, sends %v", c.missed, c.sends)
	}
	a.Ack(4, c.sends[0].id, 0)
	if !b.Add(publish(t, 1, 9), 0, 0, 0) {
		t.Fatal("no room after an ack")
	}
	a.Discard()
	b.Discard()
	if bytes := cfg.Stats.Bytes.Load(); bytes != 0 {
		t.Fatalf("%d bytes held after both went", bytes)
	}
}

// TestColdRestore: a session restored cold holds only the figures of its
// messages until a connection comes; then it sends them all, in order, with
// DUP where they were sent before; a message whose record went is dropped.
func TestColdRestore(t *testing.T) {
	store := &memStore{recs: map[uint64][]byte{}}
	cfg := &Config{Max: 100, Store: store}
	o := New("c", cfg)
	o.SetPersistent(true)
	for n := range 5 {
		o.Add(publish(t, 1+byte(n%2), n), 0, 0, 0)
	}
	c := &fakeConn{}
	o.Attach(c, 2) // two sent, three queued
	o.Detach(c)
	var cs []Cold
	for _, r := range store.records() {
		cl, err := PeekRecord(r.Seq, r.Val)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, cl)
	}
	cfg2 := &Config{Max: 100, Store: store}
	o = New("c", cfg2)
	if errs := o.RestoreCold(store.meta, cs); len(errs) > 0 {
		t.Fatal(errs)
	}
	snap := o.Snapshot(10)
	if len(snap) != 5 || !snap[0].Cold || snap[0].Topic != "" || snap[1].QoS != 2 || snap[0].Size != len(publish(t, 1, 0).B) {
		t.Fatalf("snapshot %+v", snap)
	}
	if cold := cfg2.Stats.ColdBytes.Load(); cold != cfg2.Stats.Bytes.Load() || cold == 0 {
		t.Fatalf("cold bytes %d of %d", cold, cfg2.Stats.Bytes.Load())
	}
	delete(store.recs, 4) // message 3's record is lost before it is loaded
	c = &fakeConn{}
	o.Attach(c, 0)
	var got []int
	for _, s := range c.sends {
		got = append(got, s.n)
		if s.dup != (s.n < 2) {
			t.Fatalf("message %d sent with dup %v", s.n, s.dup)
		}
	}
	if len(got) != 4 || got[0] != 0 || got[1] != 1 || got[2] != 2 || got[3] != 4 {
		t.Fatalf("sent %v", got)
	}
	if cfg2.Stats.ColdBytes.Load() != 0 || cfg2.Stats.LoadErrors.Load() != 1 {
		t.Fatalf("cold bytes %d, load errors %d", cfg2.Stats.ColdBytes.Load(), cfg2.Stats.LoadErrors.Load())
	}
}
