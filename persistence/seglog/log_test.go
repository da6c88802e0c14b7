package seglog

import (
	"bytes"
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, smallOpts(t, dir), nil)
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddGroup(2, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	for n := uint64(1); n <= 100; n++ {
		res := appendWait(t, l, []uint64{1, 2}, payload(1, n, 40))
		for i, r := range res {
			if r.Err != nil || r.Offset != n {
				t.Fatalf("append %d to group %d: %+v", n, i+1, r)
			}
		}
	}
	for _, g := range []uint64{1, 2} {
		got := readAll(t, l, g, 1)
		if len(got) != 100 {
			t.Fatalf("group %d: read %d entries", g, len(got))
		}
		for i, e := range got {
			if e.Offset != uint64(i+1) || !bytes.Equal(e.Data, payload(1, uint64(i+1), 40)) {
				t.Fatalf("group %d: entry %d: %d %q", g, i, e.Offset, e.Data)
			}
		}
	}
	if err := l.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
	for _, g := range []uint64{1, 2} {
		got := readAll(t, l2, g, 0)
		if len(got) != 100 {
			t.Fatalf("after reopen: group %d: read %d entries", g, len(got))
		}
		for i, e := range got {
			if e.Offset != uint64(i+1) || !bytes.Equal(e.Data, payload(1, uint64(i+1), 40)) {
				t.Fatalf("after reopen: group %d: entry %d: %d %q", g, i, e.Offset, e.Data)
			}
		}
	}
	if off := appendOK(t, l2, 1, []byte("next")); off != 101 {
		t.Fatalf("offset after reopen: %d", off)
	}
	res := appendWait(t, l2, []uint64{3}, []byte("x"))
	if !errors.Is(res[0].Err, ErrGroupNotFound) {
		t.Fatalf("append to an unknown group: %v", res[0].Err)
	}
}

func TestLimits(t *testing.T) {
	l := openLog(t, smallOpts(t, t.TempDir()), nil)
	if err := l.AddGroup(1, GroupState{}, Limits{MaxMessages: 3}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddGroup(2, GroupState{}, Limits{MaxBytes: 100, DropOldest: true}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddGroup(1, GroupState{}, Limits{}); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("AddGroup of an existing id: %v", err)
	}
	// Reject: the fourth message is refused; resolving one makes room.
	for n := uint64(1); n <= 3; n++ {
		appendOK(t, l, 1, payload(1, n, 20))
	}
	if res := appendWait(t, l, []uint64{1}, payload(1, 4, 20)); !errors.Is(res[0].Err, ErrBacklogFull) {
		t.Fatalf("append past MaxMessages: %+v", res[0])
	}
	l.Resolve(1, []uint64{2})
	if off := appendOK(t, l, 1, payload(1, 4, 20)); off != 4 {
		t.Fatalf("offset after a refusal: %d", off)
	}
	gi, _ := l.Group(1)
	if gi.Refused != 1 || gi.Messages != 3 || gi.Head != 4 || gi.Cursor != 0 {
		t.Fatalf("group 1: %+v", gi)
	}
	// A message larger than MaxBytes is refused even under DropOldest.
	if res := appendWait(t, l, []uint64{2}, make([]byte, 101)); !errors.Is(res[0].Err, ErrBacklogFull) {
		t.Fatalf("append larger than MaxBytes: %+v", res[0])
	}
	// DropOldest: 40-byte messages, 100 bytes: two fit; each further one drops the oldest.
	for n := uint64(1); n <= 5; n++ {
		if off := appendOK(t, l, 2, payload(2, n, 40)); off != n {
			t.Fatalf("drop-oldest append %d got offset %d", n, off)
		}
	}
	gi, _ = l.Group(2)
	if gi.Messages != 2 || gi.Bytes != 80 || gi.Dropped != 3 || gi.Cursor != 3 || gi.Head != 5 {
		t.Fatalf("group 2 after drops: %+v", gi)
	}
	// Several appends in one commit: the batch drops its own oldest.
	ch := make(chan Result, 10)
	for n := uint64(6); n <= 15; n++ {
		l.Append([]uint64{2}, payload(2, n, 40), func(r []Result) { ch <- r[0] })
	}
	for range 10 {
		if r := <-ch; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	got := readAll(t, l, 2, 0)
	if len(got) != 2 || got[0].Offset != 14 || got[1].Offset != 15 || !bytes.Equal(got[1].Data, payload(2, 15, 40)) {
		t.Fatalf("group 2 holds %v", offsets(got))
	}
	gi, _ = l.Group(2)
	if gi.Dropped != 13 || gi.Cursor != 13 {
		t.Fatalf("group 2: %+v", gi)
	}
	if err := l.SetLimits(9, Limits{}); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("SetLimits of an unknown group: %v", err)
	}
	if _, err := l.Group(9); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("Group of an unknown group: %v", err)
	}
	if _, err := l.ReadFrom(9, 1, 1, nil); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("ReadFrom of an unknown group: %v", err)
	}
	res := appendWait(t, l, []uint64{1}, make([]byte, MaxMessageSize+1))
	if !errors.Is(res[0].Err, ErrTooLarge) {
		t.Fatalf("append of a too large message: %v", res[0].Err)
	}
}

func offsets(es []Entry) []uint64 {
	var o []uint64
	for _, e := range es {
		o = append(o, e.Offset)
	}
	return o
}

// TestReadFrom reads from the cache and from disk (tiny caches force misses)
// and checks it returns exactly the unresolved entries in order.
func TestReadFrom(t *testing.T) {
	for _, tc := range []struct {
		name              string
		cache, groupCache int64
	}{
		{"cached", 0, 0},
		{"tiny-cache", 4 << 10, 1 << 10},
		{"no-cache", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := smallOpts(t, t.TempDir())
			opts.CacheBytes, opts.GroupCacheBytes = tc.cache, tc.groupCache
			opts.CompactLiveRatio = -1
			l := openLog(t, opts, nil)
			for g := uint64(1); g <= 3; g++ {
				if err := l.AddGroup(g, GroupState{}, Limits{}); err != nil {
					t.Fatal(err)
				}
			}
			const n = 3000
			ch := make(chan []Result, 64)
			for i := uint64(1); i <= n; i++ {
				l.Append([]uint64{1, 2, 3}, payload(9, i, 30+int(i%50)), func(r []Result) { ch <- append([]Result(nil), r...) })
				if i%64 == 0 {
					for range 64 {
						<-ch
					}
				}
			}
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			for len(ch) > 0 {
				<-ch
			}
			// Resolve every third offset of group 2 and a block of group 3.
			var res []uint64
			for i := uint64(1); i <= n; i += 3 {
				res = append(res, i)
			}
			l.Resolve(2, res)
			res = res[:0]
			for i := uint64(100); i <= 2000; i++ {
				res = append(res, i)
			}
			l.Resolve(3, res)
			check := func(l *Log, stage string) {
				for g := uint64(1); g <= 3; g++ {
					got := readAll(t, l, g, 1)
					i := 0
					for off := uint64(1); off <= n; off++ {
						if g == 2 && off%3 == 1 || g == 3 && off >= 100 && off <= 2000 {
							continue
						}
						if i >= len(got) || got[i].Offset != off || !bytes.Equal(got[i].Data, payload(9, off, 30+int(off%50))) {
							t.Fatalf("%s: group %d: entry %d: want offset %d, got %v", stage, g, i, off, got[i:min(i+3, len(got))])
						}
						i++
					}
					if i != len(got) {
						t.Fatalf("%s: group %d: %d extra entries", stage, g, len(got)-i)
					}
				}
			}
			check(l, "first read")
			check(l, "second read") // everything from disk now
			st := l.Stats()
			if tc.cache < 0 && st.CacheHits != 0 {
				t.Fatalf("cache hits without a cache: %+v", st)
			}
			if tc.cache != 0 && st.CacheMisses == 0 {
				t.Fatalf("no cache misses with a tiny cache: %+v", st)
			}
			if tc.cache == 0 && st.CacheHits == 0 {
				t.Fatalf("no cache hits: %+v", st)
			}
			if err := l.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			// Partial reads continue where they stopped, from any source.
			got, err := l.ReadFrom(1, 10, 5, nil)
			if err != nil || len(got) != 5 || got[0].Offset != 10 || got[4].Offset != 14 {
				t.Fatalf("ReadFrom(1, 10, 5): %v %v", offsets(got), err)
			}
		})
	}
}
