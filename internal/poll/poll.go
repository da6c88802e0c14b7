// Package poll waits in tests for a condition that no event announces: a
// figure another goroutine or process changes (an admin API view, a
// background checkpoint, a counter). It asks the condition on a ticker until
// it holds or a deadline passes, as nats-server's checkFor does. Where an
// event says the condition holds (a channel, a callback), wait on that.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until asks.
const Interval = 5 * time.Millisecond

// Until returns once cond holds, and fails t if it still does not after
// timeout; what names the condition in the failure.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Within reports whether cond held within timeout, asking it every Interval.
func Within(timeout time.Duration, cond func() bool) bool {
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

// Progress waits until count reaches target, failing the test when count
// stays put for stall. Use it for a long run of like steps (messages
// delivered, records acknowledged): each wait then covers one step, which
// a working system makes in far less than stall however loaded the machine
// is, where one deadline for the whole run measures how much CPU the test
// got. A stuck system still fails after stall.
func Progress(t testing.TB, stall time.Duration, what string, count func() uint64, target uint64) {
	t.Helper()
	for last := count(); last < target; {
		if !Within(stall, func() bool { return count() != last }) {
			t.Fatalf("%s: stuck at %d of %d for %v", what, last, target, stall)
		}
		last = count()
	}
}
