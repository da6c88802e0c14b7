package seglog

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestCommitIntervalBoundsTheWait: an append waits for company at most the
// commit interval after it was queued (issue 27: a commit interval never
// delays a PUBACK, which the append's callback releases, longer than the
// interval plus one commit), and not at all once the commit holds what it
// waits for. In a synctest bubble the clock moves only while every
// goroutine waits, so the write and fdatasync take no time here and what is
// measured is the writer's waiting alone.
func TestCommitIntervalBoundsTheWait(t *testing.T) {
	const iv = 10 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		l := openIntervalLog(t, iv, 4)
		// appendAll queues n appends at once and returns how long after
		// they were queued each was answered.
		appendAll := func(n int) []time.Duration {
			start := time.Now()
			answered := make(chan time.Duration, n)
			for i := range n {
				l.Append([]uint64{1}, payload(1, uint64(i), 64), func(res []Result) {
					if res[0].Err != nil {
						t.Errorf("append: %v", res[0].Err)
					}
					answered <- time.Since(start)
				})
			}
			out := make([]time.Duration, n)
			for i := range out {
				out[i] = <-answered
			}
			return out
		}

		// Alone, with CommitMinAppends 4: it waits the interval, no longer.
		if got := appendAll(1); got[0] != iv {
			t.Fatalf("a lone append was answered after %v, want the interval %v", got[0], iv)
		}
		// Four at once: the commit holds what it waits for and goes at once.
		for i, d := range appendAll(4) {
			if d != 0 {
				t.Fatalf("append %d of 4 waited %v: the commit had its 4 appends", i, d)
			}
		}
		// Two: fewer than 4, so they wait, the interval after the oldest.
		for i, d := range appendAll(2) {
			if d != iv {
				t.Fatalf("append %d of 2 answered after %v, want %v", i, d, iv)
			}
		}
		// A publisher pipelining 20: the next commit waits for as many as the
		// last one answered (20), then goes without waiting for the clock.
		for round := range 3 {
			for i, d := range appendAll(20) {
				if d > iv {
					t.Fatalf("round %d: append %d of 20 answered after %v, more than the interval %v", round, i, d, iv)
				}
			}
		}
		if st := l.Stats(); st.Commits == 0 || st.Syncs != st.Commits-st.ResolveCommits {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestSparseAppendsDoNotWait: a publisher sending at a steady rate (its
// appends more than half a commit's time apart) gets no commit-interval wait,
// even after a burst made the writer expect more; a burst, its appends
// queued together, is still held back for the ones it expects.
func TestSparseAppendsDoNotWait(t *testing.T) {
	const iv = 10 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		l := openIntervalLog(t, iv, 0)
		seq := uint64(0)
		appendOne := func() <-chan time.Duration {
			start := time.Now()
			answered := make(chan time.Duration, 1)
			l.Append([]uint64{1}, payload(1, seq, 64), func(res []Result) {
				if res[0].Err != nil {
					t.Errorf("append: %v", res[0].Err)
				}
				answered <- time.Since(start)
			})
			seq++
			return answered
		}
		// burst queues 8 together: one commit, which answers 8, so that the
		// next commit expects 8.
		burst := func() {
			var cs []<-chan time.Duration
			for range 8 {
				cs = append(cs, appendOne())
			}
			for _, c := range cs {
				<-c
			}
		}
		burst()
		// A lone append right after, with no gap: it waits for the 7 the
		// writer expects, up to the interval.
		if d := <-appendOne(); d != iv {
			t.Fatalf("an append queued with no gap after a burst was answered after %v, want the interval %v", d, iv)
		}
		burst()
		// Then one every 4 ms, more than half a commit's time apart (which
		// in this bubble takes no time): answered at once, the first one
		// too, for which the writer expected 8. The sleep moves the
		// bubble's fake clock: the gap between appends is what is tested.
		for i := range 5 {
			time.Sleep(4 * time.Millisecond)
			if d := <-appendOne(); d != 0 {
				t.Fatalf("steady append %d waited %v for company that was 4 ms away", i, d)
			}
		}
		if st := l.Stats(); st.SparseCommits == 0 {
			t.Fatalf("stats %+v: no sparse commit counted", st)
		}
	})
}

// openIntervalLog opens a log with one group (1) and the commit interval iv
// (and minAppends, 0: the default), closed when the test ends.
func openIntervalLog(t *testing.T, iv time.Duration, minAppends int) *Log {
	t.Helper()
	l, err := Open(Options{Dir: t.TempDir(), SegmentSize: MinSegmentSize, CommitInterval: iv, CommitMinAppends: minAppends, Logger: testLogger(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	return l
}
