package broker

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
)

type fakeFirer struct{ fired atomic.Int32 }

func (f *fakeFirer) fire() { f.fired.Add(1) }

// Every connection put in the deadlines is woken once its deadline has
// passed (not before), one taken out is not, and the timer then stops.
func TestDeadlinesWakeEachOnceDue(t *testing.T) {
	var d deadlines
	defer d.close()
	now := time.Now()
	early, late, gone := new(fakeFirer), new(fakeFirer), new(fakeFirer)
	lateAt := now.Add(3 * deadlineTick)
	d.add(late, lateAt.UnixNano())
	d.add(early, now.Add(deadlineTick).UnixNano())
	d.add(gone, now.Add(2*deadlineTick).UnixNano())
	d.remove(gone, now.Add(2*deadlineTick).UnixNano())

	poll.Until(t, 10*time.Second, "the later deadline to be acted on", func() bool { return late.fired.Load() == 1 })
	if time.Now().Before(lateAt) {
		t.Fatalf("woken %v before its deadline", lateAt.Sub(time.Now()))
	}
	if early.fired.Load() != 1 || gone.fired.Load() != 0 {
		t.Fatalf("fired: early %d (want 1), removed %d (want 0)", early.fired.Load(), gone.fired.Load())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.buckets) != 0 || d.armed != 0 {
		t.Fatalf("after the last bucket: %d buckets, armed for tick %d", len(d.buckets), d.armed)
	}
}
