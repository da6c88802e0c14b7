package connq

import (
	"bytes"
	"testing"
)

// TestCorkedWritesLeaveTogether: frames mochi writes while the connection is
// corked (nested corks) wait for the last Uncork, then leave in their order
// with one writev made by the uncorking goroutine; uncorked, a write is
// direct again.
func TestCorkedWritesLeaveTogether(t *testing.T) {
	a, b := tcpPair(t)
	st := new(Stats)
	c := New(a, Limits{Hard: 1 << 20}, st, nil)
	defer closeAndWait(t, c)
	r := bufioReader(b)

	c.Cork()
	c.Cork()
	var want []byte
	for i := range 4 {
		ack := []byte{0x40, 2, 0, byte(i + 1)} // PUBACK i+1
		want = append(want, ack...)
		if _, err := c.Write(ack); err != nil {
			t.Fatal(err)
		}
	}
	c.Uncork(1)
	if got := r.peek(); got != 0 {
		t.Fatalf("%d bytes reached the peer with a cork left", got)
	}
	if n := st.Writes.Load(); n != 0 {
		t.Fatalf("%d writes while corked", n)
	}
	c.mu.Lock()
	scheduled := c.mu.scheduled
	c.mu.Unlock()
	if scheduled {
		t.Fatal("a writer was started while corked")
	}
	c.Uncork(1)
	if got := r.read(t, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("peer read %q, want %q", got, want)
	}
	if w, d := st.Writes.Load(), st.DirectWrites.Load(); w != 1 || d != 1 {
		t.Errorf("%d writes, %d of them by the uncorking goroutine; want 1 and 1", w, d)
	}

	if _, err := c.Write([]byte{0xd0, 0}); err != nil { // PINGRESP
		t.Fatal(err)
	}
	if got := r.read(t, 2); !bytes.Equal(got, []byte{0xd0, 0}) {
		t.Fatalf("peer read %q after the cork", got)
	}
	if w := st.Writes.Load(); w != 2 {
		t.Errorf("%d writes, want 2", w)
	}
	c.Uncork(1) // more than was corked: ignored
	c.Cork()
	c.Uncork(1)
	if _, err := c.Write([]byte{0xd0, 0}); err != nil {
		t.Fatal(err)
	}
	if got := r.read(t, 2); !bytes.Equal(got, []byte{0xd0, 0}) {
		t.Fatalf("peer read %q after an extra Uncork", got)
	}
}

// TestCorkDoesNotHoldBackAClose: a corked connection that is closed still
// flushes what was queued and finishes.
func TestCorkDoesNotHoldBackAClose(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Hard: 1 << 20}, nil, nil)
	r := bufioReader(b)
	c.Cork()
	if _, err := c.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	closeAndWait(t, c)
	if got := r.read(t, 3); string(got) != "bye" {
		t.Fatalf("peer read %q", got)
	}
}
