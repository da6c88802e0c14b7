package mqtttest

import (
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
)

// Eventually is poll.Until, kept for the cluster tests that call it: it
// checks cond every poll.Interval until it holds, and fails tb if it does
// not within d. cond may do work each time (publish a probe), paced by the
// poll.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	poll.Until(tb, d, what, cond)
}

// Within is poll.Within: whether cond held within d.
func Within(d time.Duration, cond func() bool) bool { return poll.Within(d, cond) }
