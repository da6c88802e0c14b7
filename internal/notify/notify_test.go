package notify

import "testing"

func TestRunsInOrderAndDrainsOnClose(t *testing.T) {
	n := New()
	var got []int
	onNotifier := make(chan bool, 1)
	for i := range 100 {
		n.Push(func() { got = append(got, i) })
	}
	n.Push(func() { onNotifier <- n.OnNotifier() })
	n.Close(true)
	if len(got) != 100 {
		t.Fatalf("%d of 100 callbacks ran before Close returned", len(got))
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("callback %d ran in place %d", v, i)
		}
	}
	if !<-onNotifier || n.OnNotifier() {
		t.Fatal("OnNotifier does not tell the notifier's goroutine from others")
	}
	if n.Push(func() {}) {
		t.Fatal("Push after Close succeeded")
	}
}
