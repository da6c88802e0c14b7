package keyshared

import (
	"context"
	"testing"
	"time"
)

func TestDispatcherStatesAreExact(t *testing.T) {
	h := newLoop(t, func(c *Config) { c.Window = 3 })
	a1 := h.log.append("a", time.Time{})
	a2 := h.log.append("a", time.Time{})
	b1 := h.log.append("b", time.Time{})
	c1 := h.log.append("c", time.Time{}) // past the window of 3
	if err := h.d.AddMember("m", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	h.d.Notify()
	got := map[uint64]bool{}
	for range 2 { // a1 and b1; a2 waits behind a1
		x := h.out.next(t)
		got[x.offset] = true
	}
	if !got[a1] || !got[b1] {
		t.Fatalf("delivered %v, want %d and %d", got, a1, b1)
	}
	if err := h.d.Ack("m", b1); err != nil {
		t.Fatal(err)
	}
	h.sync()
	sts, err := h.d.States(context.Background(), []uint64{a1, a2, b1, c1, 0})
	if err != nil {
		t.Fatal(err)
	}
	want := []MessageStatus{
		{Offset: a1, State: StateInFlight, Holder: "m"},
		{Offset: a2, State: StateWaiting},
		{Offset: b1, State: StateResolved},
		{Offset: c1, State: StateInFlight, Holder: "m"}, // b1's ack made room: c1 was read and sent
		{Offset: 0, State: StateResolved},
	}
	for i := range want {
		if sts[i] != want[i] {
			t.Errorf("offset %d: %+v, want %+v (%s)", want[i].Offset, sts[i], want[i], want[i].State)
		}
	}
	if s := MessageState(0).String(); s != "unknown" {
		t.Errorf("zero state prints %q", s)
	}
}

func TestDispatcherStatesUnreadPastTheWindow(t *testing.T) {
	h := newLoop(t, func(c *Config) { c.Window = 1 })
	a1 := h.log.append("a", time.Time{})
	b1 := h.log.append("b", time.Time{})
	h.d.Notify()
	h.sync()
	sts, err := h.d.States(context.Background(), []uint64{a1, b1})
	if err != nil {
		t.Fatal(err)
	}
	if sts[0].State != StateUnread || sts[1].State != StateUnread {
		t.Fatalf("states %+v: a group without members reads nothing", sts)
	}
	if err := h.d.AddMember("m", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	h.out.next(t)
	sts, err = h.d.States(context.Background(), []uint64{a1, b1})
	if err != nil {
		t.Fatal(err)
	}
	if sts[0].State != StateInFlight || sts[1].State != StateUnread {
		t.Fatalf("states %+v, want in flight then unread (window of 1)", sts)
	}
}
