package keyshared

import "testing"

// TestReturnedDelivery: a delivery the member turns out not to be able to
// read (Dispatcher.Return, once its CanRead refuses the topic) goes back to
// the head of its key uncounted, as if it had never been offered: another
// eligible member gets it, or it waits for one; the key's next message waits
// behind it; nothing is dead-lettered.
func TestReturnedDelivery(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxDeliveries = 1 })
	unreadable := map[string]bool{}
	spec := memberSpec{canRead: func(topic string) bool { return !unreadable[topic] }}
	if err := h.c.addMember("remote", spec, h.now); err != nil {
		t.Fatal(err)
	}
	h.c.poll(h.now)
	offs := h.publish("denied", "denied", "allowed")
	got := h.out.take()
	wantOffsets(t, "the heads of both keys", got, offs[0], offs[2])
	unreadable["denied"] = true
	h.c.returned("remote", offs[0], h.now)
	h.c.returned("remote", offs[0], h.now) // stale: only counted
	h.check()
	if got := h.out.take(); len(got) != 0 {
		t.Fatalf("redelivered to a member that may not read it: %+v", got)
	}
	s := h.c.stats()
	if s.UnroutableKeys != 1 || s.Delivered != 1 || s.Refused != 1 || len(h.log.deadLetters()) != 0 {
		t.Fatalf("stats %+v, dead letters %d", s, len(h.log.deadLetters()))
	}
	h.add("wide", 0)
	got = h.out.take()
	wantOffsets(t, "the returned one, once a member that may read it joins", got, offs[0])
	if got[0].member != "wide" || got[0].attempt != 1 {
		t.Fatalf("the returned one went to %q at attempt %d", got[0].member, got[0].attempt)
	}
	h.ack("wide", offs[0])
	wantOffsets(t, "the key's next message, after it", h.out.take(), offs[1])
}
