package outbox

import (
	"slices"
	"testing"
)

// refStore records what a cluster-like Store sees: the references of the
// messages held, and those of the messages finished.
type refStore struct {
	live     map[uint64]uint64 // seq -> ref
	finished []uint64          // refs, in the order they finished
}

func (s *refStore) Put(_ string, m Stored) { s.live[m.Seq] = m.Ref }
func (s *refStore) Delete(_ string, seq, ref uint64) {
	delete(s.live, seq)
	s.finished = append(s.finished, ref)
}
func (s *refStore) PutMeta(string, []byte) {}
func (s *refStore) DeleteSession(string)   { clear(s.live) }

// TestRequeueKeepsOrderAndRefs: messages loaded with Requeue (a session
// rebuilt from JetStream on another node) go out in their order, marked DUP
// when they may have been sent before, then messages added later follow;
// the Store sees every message's reference when it is put and when it
// finishes.
func TestRequeueKeepsOrderAndRefs(t *testing.T) {
	st := &refStore{live: map[uint64]uint64{}}
	o := New("c", &Config{Max: 5, Store: st})
	o.SetPersistent(true)
	var qs []Queued
	for n := range 6 {
		qs = append(qs, Queued{Pub: publish(t, 1, n), Ref: uint64(100 + n), Sent: n < 2})
	}
	if got := o.Requeue(qs); got != 5 {
		t.Fatalf("requeued %d, want 5 (Max)", got)
	}
	if o.Add(publish(t, 1, 9), 0, 0, 200) {
		t.Fatal("an add to a full outbox was taken")
	}
	if len(st.live) != 5 || st.live[1] != 100 || st.live[5] != 104 {
		t.Fatalf("store holds %v", st.live)
	}
	c := &fakeConn{}
	o.Attach(c, 0)
	var got []int
	for _, s := range c.sends {
		got = append(got, s.n)
		if s.dup != (s.n < 2) {
			t.Fatalf("message %d sent with DUP %v", s.n, s.dup)
		}
	}
	if !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("sent %v", got)
	}
	for _, s := range c.sends {
		o.Ack(4, s.id, 0)
	}
	if !slices.Equal(st.finished, []uint64{100, 101, 102, 103, 104}) || len(st.live) != 0 {
		t.Fatalf("finished refs %v, still live %v", st.finished, st.live)
	}
	if !o.Add(publish(t, 1, 7), 0, 0, 300) || st.live[6] != 300 {
		t.Fatalf("a later add: store holds %v", st.live)
	}
}

func (s *refStore) Renumber(string) { clear(s.live) }

// TestPrependGoesAheadOfLiveMessages: messages loaded with Prepend (a
// session's queued messages replayed while newer ones were already being
// delivered to it) go out first, in their order, then the ones added
// before the Prepend; a replayed message the outbox got live before or
// after is not held twice, and the Store sees every message under its new
// sequence.
func TestPrependGoesAheadOfLiveMessages(t *testing.T) {
	st := &refStore{live: map[uint64]uint64{}}
	o := New("c", &Config{Max: 10, Store: st})
	o.SetPersistent(true)
	if !o.Add(publish(t, 1, 5), 0, 0, 105) || !o.Add(publish(t, 1, 6), 0, 0, 106) {
		t.Fatal("adds refused")
	}
	var qs []Queued
	for n := 2; n <= 5; n++ { // 5 arrived live already
		qs = append(qs, Queued{Pub: publish(t, 1, n), Ref: uint64(100 + n), Sent: true})
	}
	if got := o.Prepend(qs, 105); got != 4 {
		t.Fatalf("prepended %d, want 4", got)
	}
	if !o.Add(publish(t, 1, 4), 0, 0, 104) { // a replayed one, delivered live late
		t.Fatal("a late live copy of a replayed message was refused")
	}
	if !o.Add(publish(t, 1, 7), 0, 0, 107) {
		t.Fatal("a later add refused")
	}
	if len(st.live) != 6 {
		t.Fatalf("store holds %v", st.live)
	}
	c := &fakeConn{}
	o.Attach(c, 0)
	var got []int
	for _, s := range c.sends {
		got = append(got, s.n)
		if s.dup != (s.n <= 5) { // 2-5 came through the replay
			t.Fatalf("message %d sent with DUP %v", s.n, s.dup)
		}
	}
	if !slices.Equal(got, []int{2, 3, 4, 5, 6, 7}) {
		t.Fatalf("sent %v", got)
	}
	for _, s := range c.sends {
		o.Ack(4, s.id, 0)
	}
	if !slices.Equal(st.finished, []uint64{102, 103, 104, 105, 106, 107}) || len(st.live) != 0 {
		t.Fatalf("finished refs %v, still live %v", st.finished, st.live)
	}
}
