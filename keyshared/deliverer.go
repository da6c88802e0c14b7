package keyshared

// Deliverer hands messages to members; the broker's hook implements it over
// mochi clients. The dispatcher calls it from its own goroutine only, so its
// methods must not block and must not call back into the Dispatcher
// synchronously except through Ack, Nack, Reject and Notify (which never wait
// for the dispatcher).
type Deliverer interface {
	// Deliver sends m to member. attempt is 1 for the first delivery of the
	// message since the dispatcher started and grows with each redelivery.
	// m is shared and must not be modified; it stays valid after the call.
	//
	// Deliver returns false when the member cannot take a message now (its
	// queue or send quota is full, or it is not connected). The dispatcher
	// then treats the message as not delivered, does not count an attempt,
	// holds the key for that member and offers it again after the member's
	// next ack or the next heartbeat.
	Deliver(member string, m *Message, attempt int) bool
	// Revoke tells that a delivery of offset to member is no longer awaited:
	// its ack timed out, or the member was removed or evicted. The hook
	// forgets the delivery (and removes it from the session's inflight state,
	// so a resumed session does not resend it). Should an ack for it still
	// arrive, the dispatcher accepts it only while the message waits for its
	// retry; once it is delivered again the late ack is ignored.
	Revoke(member string, offset uint64)
}

// A Deliverer that also implements Flusher is told after each round of the
// dispatcher's work (the deliveries one message, ack or tick led to):
// deliveries made in one round may wait for Flush, so that those due
// together leave together (one write per member). Flush runs on the
// dispatcher's goroutine and must not block.
type Flusher interface {
	Flush()
}
