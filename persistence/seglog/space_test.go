package seglog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dirBytes returns the bytes of the segment files in dir and their count.
func dirBytes(t testing.TB, dir string) (int64, int) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	c := 0
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), segSuffix) {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
		c++
	}
	return n, c
}

// TestSpaceFollowsUnresolved appends a million small messages to one group,
// resolves all but one early offset, checkpoints periodically, and checks
// that the directory stays within a few segments: compaction copies the
// blocked message forward instead of keeping every segment after it.
func TestSpaceFollowsUnresolved(t *testing.T) {
	total := uint64(1_000_000)
	if testing.Short() {
		total = 200_000
	}
	const segSize = 1 << 20
	const blocked = 5
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentSize: segSize, NoSync: true, Logger: testLogger(t), ResolveDelay: 1}
	l := openLog(t, opts, nil)
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	const inflight = 512
	sem := make(chan struct{}, inflight)
	errc := make(chan error, 1)
	var acked []uint64 // touched only on the notifier goroutine
	done := func(r []Result) {
		<-sem
		if r[0].Err != nil {
			select {
			case errc <- r[0].Err:
			default:
			}
			return
		}
		if r[0].Offset != blocked {
			acked = append(acked, r[0].Offset)
		}
		if len(acked) >= 64 {
			l.Resolve(1, acked)
			acked = acked[:0]
		}
	}
	msg := []byte("0123456789abcdefghij")
	var maxBytes int64
	maxSegs := 0
	for i := uint64(1); i <= total; i++ {
		sem <- struct{}{}
		l.Append([]uint64{1}, msg, done)
		if i%20_000 == 0 {
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			s := l.Checkpoint()
			l.Checkpointed(s)
			b, c := dirBytes(t, dir)
			if b > maxBytes {
				maxBytes, maxSegs = b, c
			}
		}
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	l.Resolve(1, acked) // Sync ran the callbacks: acked is ours now
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	gi, _ := l.Group(1)
	if gi.Head != total || gi.Cursor != blocked-1 || gi.Messages != 1 {
		t.Fatalf("group: %+v", gi)
	}
	// Let compaction settle, then checkpoint: only a few segments remain.
	waitFor(t, "compaction to settle", func() bool {
		s := l.Checkpoint()
		l.Checkpointed(s)
		_, c := dirBytes(t, dir)
		return c <= 3
	})
	b, c := dirBytes(t, dir)
	st := l.Stats()
	t.Logf("%d appends, %d MiB written: on disk at most %d bytes (%d segments) during the run, %d bytes (%d segments) at the end; live: %d record(s), %d bytes; %d compactions, %d records moved, %d segments removed",
		total, st.BytesWritten>>20, maxBytes, maxSegs, b, c, st.LiveRecords, gi.Bytes, st.Compactions, st.Moved, st.Removed)
	if maxSegs > 8 {
		t.Fatalf("the directory grew to %d segments (%d bytes)", maxSegs, maxBytes)
	}
	got := readAll(t, l, 1, 0)
	if len(got) != 1 || got[0].Offset != blocked || string(got[0].Data) != string(msg) {
		t.Fatalf("group holds %v", offsets(got))
	}
	if st.Moved == 0 || st.Removed == 0 {
		t.Fatalf("no compaction or removal: %+v", st)
	}
	// The moved copy survives reopening with the last checkpoint.
	s := l.Checkpoint()
	l.Checkpointed(s)
	l = reopen(t, l, s)
	got = readAll(t, l, 1, 0)
	if len(got) != 1 || got[0].Offset != blocked || string(got[0].Data) != string(msg) {
		t.Fatalf("after reopen the group holds %v", offsets(got))
	}
}
