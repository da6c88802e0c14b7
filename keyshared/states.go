package keyshared

import "context"

// MessageState is where one message of a group's log stands, as the dispatch
// loop sees it.
type MessageState uint8

const (
	// StateResolved: acknowledged, dead-lettered, dropped or expired; the
	// cursor may not have passed it yet (acks above the cursor).
	StateResolved MessageState = iota + 1
	// StateWaiting: read into the window, not in flight: behind its key's
	// message in flight, or waiting for a member with room or at all.
	StateWaiting
	// StateInFlight: delivered to Holder, awaiting its answer.
	StateInFlight
	// StateRetrying: an attempt failed; it waits out its backoff.
	StateRetrying
	// StatePoisoned: out of attempts under the block poison policy; its key stops.
	StatePoisoned
	// StateDeadLettering: to be dead-lettered; the store failed and the heartbeat retries.
	StateDeadLettering
	// StateUnread: past what the dispatcher has read from the log (the window is full).
	StateUnread
)

var stateNames = [...]string{
	StateResolved: "resolved", StateWaiting: "waiting", StateInFlight: "in-flight",
	StateRetrying: "retrying", StatePoisoned: "poisoned", StateDeadLettering: "dead-lettering",
	StateUnread: "unread",
}

func (s MessageState) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return "unknown"
}

// MessageStatus is one message's state; Holder and Attempts are set while
// the message is in the window.
type MessageStatus struct {
	Offset   uint64
	State    MessageState
	Holder   string // the member holding it, StateInFlight only
	Attempts int    // failed deliveries so far
}

// States returns the state of each offset, in the order given, as the loop
// sees it between two iterations (so the answer is one consistent moment).
// Offsets at or below the cursor are resolved.
func (d *Dispatcher) States(ctx context.Context, offsets []uint64) ([]MessageStatus, error) {
	out := make([]MessageStatus, len(offsets))
	err := d.doCtx(ctx, command{kind: cmdStates, offsets: offsets, states: out})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// states fills out with the state of each offset (loop goroutine only).
func (c *core) states(offsets []uint64, out []MessageStatus) {
	for i, off := range offsets {
		s := MessageStatus{Offset: off}
		switch e := c.w.byOffset.get(off); {
		case e != nil:
			s.Attempts = e.attempts
			switch e.state {
			case entryInflight:
				s.State = StateInFlight
				if e.holder != nil {
					s.Holder = e.holder.id
				}
			case entryRetry:
				s.State = StateRetrying
			case entryPoisoned:
				s.State = StatePoisoned
			case entryDLQPending:
				s.State = StateDeadLettering
			default:
				s.State = StateWaiting
			}
		case off > c.lastRead:
			s.State = StateUnread
		default:
			s.State = StateResolved
		}
		out[i] = s
	}
}
