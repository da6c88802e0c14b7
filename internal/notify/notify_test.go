package notify

import "testing"

func TestRunsInOrderAndDrainsOnClose(t *testing.T) {
	n := New()
	var got []int
	for i := range 100 {
		n.Push(func() { got = append(got, i) })
	}
	n.Close(true)
	if len(got) != 100 {
		t.Fatalf("%d of 100 callbacks ran before Close returned", len(got))
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("callback %d ran in place %d", v, i)
		}
	}
	if n.Push(func() {}) {
		t.Fatal("Push after Close succeeded")
	}
}

// TestCloseFromACallback: a callback closes the notifier without waiting for
// itself; what was queued before the Close still runs.
func TestCloseFromACallback(t *testing.T) {
	n := New()
	ran := make(chan int, 2)
	gate := make(chan struct{})
	n.Push(func() { <-gate; n.Close(false); ran <- 1 })
	if !n.Push(func() { ran <- 2 }) {
		t.Fatal("Push before Close failed")
	}
	close(gate)
	if a, b := <-ran, <-ran; a != 1 || b != 2 {
		t.Fatalf("ran %d then %d", a, b)
	}
	if n.Push(func() {}) {
		t.Fatal("Push after Close succeeded")
	}
	n.Close(true) // a second Close waits for the goroutine, which has ended
}
