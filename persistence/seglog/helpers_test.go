package seglog

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
)

// testLogger routes the log's messages to t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// smallOpts are options for tests: small segments, no fsync.
func smallOpts(t testing.TB, dir string) Options {
	return Options{Dir: dir, SegmentSize: MinSegmentSize, NoSync: true, Logger: testLogger(t)}
}

// openLog opens a log and closes it (checking its invariants) in t.Cleanup,
// unless the test closed it.
func openLog(t testing.TB, opts Options, groups map[uint64]GroupState) *Log {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	l, err := Open(opts, groups)
	if err != nil {
		t.Fatalf("Open(%s): %v", opts.Dir, err)
	}
	if err := l.checkInvariants(); err != nil {
		t.Fatalf("after Open: %v", err)
	}
	t.Cleanup(func() {
		if err := l.checkInvariants(); err != nil {
			t.Errorf("at cleanup: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// appendWait appends msg to groups and waits for the results.
func appendWait(t testing.TB, l *Log, groups []uint64, msg []byte) []Result {
	t.Helper()
	ch := make(chan []Result, 1)
	l.Append(groups, msg, func(res []Result) { ch <- append([]Result(nil), res...) })
	select {
	case res := <-ch:
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("append callback did not run")
		return nil
	}
}

// appendOK appends msg to one group and returns its offset.
func appendOK(t testing.TB, l *Log, g uint64, msg []byte) uint64 {
	t.Helper()
	res := appendWait(t, l, []uint64{g}, msg)
	if res[0].Err != nil {
		t.Fatalf("append to %d: %v", g, res[0].Err)
	}
	return res[0].Offset
}

// payload returns the deterministic test message of group g, sequence n,
// size bytes at least 16.
func payload(g, n uint64, size int) []byte {
	b := fmt.Appendf(nil, "g%d/n%d|", g, n)
	for len(b) < size {
		b = append(b, byte('a'+(n+uint64(len(b)))%26))
	}
	return b
}

// readAll reads every unresolved entry of the group from from on.
func readAll(t testing.TB, l *Log, g, from uint64) []Entry {
	t.Helper()
	var out []Entry
	for {
		n := len(out)
		var err error
		out, err = l.ReadFrom(g, from, 7, out)
		if err != nil {
			t.Fatalf("ReadFrom(%d, %d): %v", g, from, err)
		}
		if len(out) == n {
			return out
		}
		from = out[len(out)-1].Offset + 1
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 30*time.Second, what, cond)
}
