package mqtttest

import (
	"testing"
	"time"
)

// PollEvery is how often Eventually checks its condition.
const PollEvery = 5 * time.Millisecond

// Eventually checks cond every PollEvery until it holds, and fails tb if it
// does not within d: the deadline poll for state that has no event to wait
// on (another node's view, a NATS server's interest). cond may do work each
// time (publish a probe), paced by the poll.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Within(d, cond) {
		tb.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// Within is Eventually that reports whether cond held in time instead of
// failing (for benchmarks and callers with their own message).
func Within(d time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(PollEvery)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
			if cond() {
				return true
			}
		}
	}
}
