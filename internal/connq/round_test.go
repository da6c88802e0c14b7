package connq

import (
	"bytes"
	"testing"
)

// roundConn is a TCP connection's queue with its peer's reader and counters.
type roundConn struct {
	c  *Conn
	r  *peerReader
	st *Stats
}

func newRoundConn(t *testing.T) roundConn {
	t.Helper()
	a, b := tcpPair(t)
	st := new(Stats)
	c := New(a, Limits{Hard: 4 << 20}, st, nil)
	t.Cleanup(func() { closeAndWait(t, c) })
	return roundConn{c: c, r: bufioReader(b), st: st}
}

func corks(c *Conn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.corked
}

// framesOf is what pubN(from) ... pubN(to-1) put on the wire.
func framesOf(from, to int) []byte {
	var b []byte
	for i := from; i < to; i++ {
		b = append(b, pubN(i).B...)
	}
	return b
}

// TestRoundHoldsWritersUntilItEnds: frames queued on connections a round
// holds stay queued, with no writer started, until the round ends; then each
// connection's frames leave in order with one writev.
func TestRoundHoldsWritersUntilItEnds(t *testing.T) {
	reader := newRoundConn(t)
	subs := []roundConn{newRoundConn(t), newRoundConn(t)}

	r := reader.c.BeginRound()
	if reader.c.Round() != r {
		t.Fatal("Round does not return the round in progress")
	}
	for i := range 10 {
		for _, s := range subs {
			reader.c.Round().Hold(s.c)
			if !s.c.Enqueue(pubN(i)) {
				t.Fatal("not queued")
			}
		}
	}
	for i, s := range subs {
		if n := s.r.peek(); n != 0 {
			t.Fatalf("subscriber %d got %d bytes during the round", i, n)
		}
		if corks(s.c) != 1 {
			t.Fatalf("subscriber %d corked %d times, want once", i, corks(s.c))
		}
	}
	reader.c.EndRound(r)
	if reader.c.Round() != nil {
		t.Fatal("a round is still in progress after EndRound")
	}
	want := framesOf(0, 10)
	for i, s := range subs {
		if got := s.r.read(t, len(want)); !bytes.Equal(got, want) {
			t.Fatalf("subscriber %d read %q, want %q", i, got, want)
		}
		waitFor(t, func() bool { return s.st.Frames.Load() == 10 })
		if w := s.st.Writes.Load(); w != 1 {
			t.Errorf("subscriber %d: %d writes for the round's 10 frames, want 1", i, w)
		}
		if corks(s.c) != 0 {
			t.Errorf("subscriber %d still corked", i)
		}
	}
}

// TestRoundLetsGoAtItsBudget: a round that has held RoundBudget frames lets
// them go before it holds the next, so a long read does not hold the first
// of its frames back to its end.
func TestRoundLetsGoAtItsBudget(t *testing.T) {
	reader, sub := newRoundConn(t), newRoundConn(t)
	r := reader.c.BeginRound()
	var want []byte
	for i := range RoundBudget {
		r.Hold(sub.c)
		sub.c.Enqueue(pubN(i % 1000))
		want = append(want, pubN(i%1000).B...)
	}
	r.Hold(sub.c) // one more: the budget's frames go
	if got := sub.r.read(t, len(want)); !bytes.Equal(got, want) {
		t.Fatal("the first RoundBudget frames were not let go in order during the round")
	}
	waitFor(t, func() bool { // their writer is done (a running writer takes what is queued)
		sub.c.mu.Lock()
		defer sub.c.mu.Unlock()
		return !sub.c.mu.scheduled
	})
	sub.c.Enqueue(pubN(RoundBudget % 1000))
	if n := sub.r.peek(); n != 0 {
		t.Fatalf("%d bytes of the frame held after the budget left during the round", n)
	}
	reader.c.EndRound(r)
	last := pubN(RoundBudget % 1000).B
	if got := sub.r.read(t, len(last)); !bytes.Equal(got, last) {
		t.Fatalf("read %q after the round, want %q", got, last)
	}
}

// TestRoundAfterItsEndHoldsNothing: a Hold that comes after the round ended
// (another goroutine that looked it up before) corks nothing.
func TestRoundAfterItsEndHoldsNothing(t *testing.T) {
	reader, sub := newRoundConn(t), newRoundConn(t)
	r := reader.c.BeginRound()
	reader.c.EndRound(r)
	r.Hold(sub.c)
	var none *Round
	none.Hold(sub.c) // no round: nothing held
	if corks(sub.c) != 0 {
		t.Fatal("a round that ended corked a connection")
	}
	sub.c.Enqueue(pubN(1))
	if got, want := sub.r.read(t, len(pubN(1).B)), pubN(1).B; !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// TestTwoRoundsHoldingOneConnection: two publishers' rounds hold the same
// subscriber, each possibly more than once as they take turns; its frames
// leave once both rounds ended, and no cork is left.
func TestTwoRoundsHoldingOneConnection(t *testing.T) {
	p1, p2, sub := newRoundConn(t), newRoundConn(t), newRoundConn(t)
	r1, r2 := p1.c.BeginRound(), p2.c.BeginRound()
	r1.Hold(sub.c)
	r2.Hold(sub.c)
	r1.Hold(sub.c) // r2 took the connection's round fields: r1 corks it again
	sub.c.Enqueue(pubN(1))
	p1.c.EndRound(r1)
	if n := sub.r.peek(); n != 0 {
		t.Fatalf("%d bytes left while the second round held the connection", n)
	}
	p2.c.EndRound(r2)
	if got, want := sub.r.read(t, len(pubN(1).B)), pubN(1).B; !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
	if corks(sub.c) != 0 {
		t.Fatalf("%d corks left", corks(sub.c))
	}
}

// TestRoundDoesNotHoldBackAClose: a held connection that is closed flushes
// and finishes before the round ends.
func TestRoundDoesNotHoldBackAClose(t *testing.T) {
	reader := newRoundConn(t)
	a, b := tcpPair(t)
	sub := New(a, Limits{Hard: 1 << 20}, nil, nil)
	r := reader.c.BeginRound()
	defer reader.c.EndRound(r)
	r.Hold(sub)
	sub.Enqueue(pubN(7))
	closeAndWait(t, sub)
	if got, want := bufioReader(b).read(t, len(pubN(7).B)), pubN(7).B; !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
}
