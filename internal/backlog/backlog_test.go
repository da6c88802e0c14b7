package backlog

import "testing"

func TestLimits(t *testing.T) {
	l := Limits{MaxMessages: 2, MaxBytes: 100}
	for _, c := range []struct {
		held, bytes, size uint64
		over              bool
	}{{0, 0, 100, false}, {1, 50, 50, false}, {2, 10, 1, true}, {1, 60, 41, true}, {0, 0, 0, false}} {
		if got := l.Over(c.held, c.bytes, c.size); got != c.over {
			t.Errorf("Over(%d, %d, %d) = %v", c.held, c.bytes, c.size, got)
		}
	}
	if !l.TooLarge(101) || l.TooLarge(100) || (Limits{}).TooLarge(1<<40) || (Limits{}).Over(1<<40, 1<<40, 1<<40) {
		t.Fatal("TooLarge or unbounded limits")
	}
}
