package outbox

import "testing"

// TestLongRunKeepsEverything streams many messages through a small window,
// acknowledging each as it arrives: nothing is lost and the queue compacts.
func TestLongRunKeepsEverything(t *testing.T) {
	cfg := &Config{Max: 1000}
	o := New("c", cfg)
	c := &fakeConn{}
	o.Attach(c, 20)
	acked := 0
	for n := range 30000 {
		if !o.Add(publish(t, 1, n), 0, 0, 0) {
			t.Fatalf("message %d refused; held %v", n, fmtLen(o))
		}
		for len(c.sends) > 0 { // an acknowledgement sends the next message
			s := c.sends[0]
			c.sends = c.sends[1:]
			if s.n != acked {
				t.Fatalf("sent message %d, want %d", s.n, acked)
			}
			if !o.Ack(4, s.id, 0) {
				t.Fatalf("acknowledgement of message %d (id %d) not taken", s.n, s.id)
			}
			acked++
		}
	}
	if held, _ := o.Len(); held != 0 || acked != 30000 {
		t.Fatalf("held %d, acknowledged %d", held, acked)
	}
}

func fmtLen(o *Outbox) [2]int {
	h, i := o.Len()
	return [2]int{h, i}
}
