package seglog

import (
	"bytes"
	"testing"
)

// reopen closes l and opens its directory again with the checkpoint s (and
// the states in extra for groups added after it).
func reopen(t *testing.T, l *Log, s *Snapshot) *Log {
	t.Helper()
	opts := l.opts
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return openLog(t, opts, s.Groups)
}

func TestResolveCheckpointReopen(t *testing.T) {
	opts := smallOpts(t, t.TempDir())
	l := openLog(t, opts, nil)
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddGroup(2, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	for i := uint64(1); i <= n; i++ {
		l.Append([]uint64{1, 2}, payload(1, i, 60), nil)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	// Group 1: offset 7 blocked, everything else resolved (out of order, in bursts).
	var res []uint64
	for i := uint64(n); i >= 1; i-- {
		if i != 7 {
			res = append(res, i)
		}
		if len(res) == 100 {
			l.Resolve(1, res)
			res = res[:0]
		}
	}
	l.Resolve(1, res)
	// Group 2: 1..1000 resolved, then every other offset.
	res = res[:0]
	for i := uint64(1); i <= n; i++ {
		if i <= 1000 || i%2 == 0 {
			res = append(res, i)
		}
	}
	l.Resolve(2, res)
	l.Resolve(2, res) // idempotent
	gi, _ := l.Group(1)
	if gi.Cursor != 6 || gi.Messages != 1 || gi.Head != n || gi.Bytes != 60 {
		t.Fatalf("group 1: %+v", gi)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if gi, _ := l.Group(1); gi.DurableCursor != 6 {
		t.Fatalf("durable cursor after Sync: %+v", gi)
	}
	gi2, _ := l.Group(2)
	if gi2.Cursor != 1000 || gi2.Messages != (n-1000)/2 {
		t.Fatalf("group 2: %+v", gi2)
	}
	s := l.Checkpoint()
	if st := s.Groups[1]; st.Cursor != 6 || len(st.Resolved) != 1 || st.Resolved[0] != (Range{8, n}) || st.Head != n {
		t.Fatalf("checkpoint of group 1: %+v", st)
	}
	l.Checkpointed(s)
	check := func(l *Log, stage string) {
		t.Helper()
		got := readAll(t, l, 1, 0)
		if len(got) != 1 || got[0].Offset != 7 || !bytes.Equal(got[0].Data, payload(1, 7, 60)) {
			t.Fatalf("%s: group 1 holds %v", stage, offsets(got))
		}
		got = readAll(t, l, 2, 0)
		if len(got) != (n-1000)/2 || got[0].Offset != 1001 || got[len(got)-1].Offset != n-1 {
			t.Fatalf("%s: group 2 holds %d entries, %v...", stage, len(got), offsets(got[:min(3, len(got))]))
		}
		gi, _ := l.Group(1)
		if gi.Cursor != 6 || gi.Messages != 1 || gi.Head != n {
			t.Fatalf("%s: group 1: %+v", stage, gi)
		}
	}
	check(l, "before reopen")
	l = reopen(t, l, s)
	check(l, "reopened from the checkpoint")
	// Without the checkpoint's resolved set: the resolve records in the log suffice.
	s2 := &Snapshot{Groups: map[uint64]GroupState{1: {}, 2: {}}}
	l = reopen(t, l, s2)
	check(l, "reopened from the log alone")
	// Resolving the blocked offset moves the cursor to the head.
	l.Resolve(1, []uint64{7})
	if gi, _ := l.Group(1); gi.Cursor != n || gi.Messages != 0 || gi.Bytes != 0 {
		t.Fatalf("after resolving the blocked offset: %+v", gi)
	}
	l = reopen(t, l, s2) // Close committed the resolution
	if gi, _ := l.Group(1); gi.Cursor != n || gi.Messages != 0 {
		t.Fatalf("after reopen: %+v", gi)
	}
	if off := appendOK(t, l, 1, []byte("after")); off != n+1 {
		t.Fatalf("next offset %d", off)
	}
}

// TestResolveDelay: a resolution is committed alone once ResolveDelay passes.
func TestResolveDelay(t *testing.T) {
	opts := smallOpts(t, t.TempDir())
	l := openLog(t, opts, nil)
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	appendOK(t, l, 1, []byte("a"))
	appendOK(t, l, 1, []byte("b"))
	l.Resolve(1, []uint64{1})
	gi, _ := l.Group(1)
	if gi.Cursor != 1 {
		t.Fatalf("cursor %d", gi.Cursor)
	}
	waitFor(t, "the resolve commit", func() bool {
		gi, _ := l.Group(1)
		return gi.DurableCursor == 1 && l.Stats().ResolveCommits == 1
	})
}
