package seglog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestCallbackOrder: callbacks run in submission order, each commit's
// OnAppend after its callbacks, and a callback may call the log.
func TestCallbackOrder(t *testing.T) {
	opts := smallOpts(t, t.TempDir())
	var events []string // appended on the notifier goroutine only
	var l *Log
	opts.OnAppend = func(g, head uint64) { events = append(events, fmt.Sprintf("head %d %d", g, head)) }
	l = openLog(t, opts, nil)
	for g := uint64(1); g <= 2; g++ {
		if err := l.AddGroup(g, GroupState{}, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	const n = 500
	var wg sync.WaitGroup
	var mu sync.Mutex
	submitted := map[uint64][]int{} // group -> submission numbers in order
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				g := uint64(1 + (w+i)%2)
				mu.Lock() // submission order = order under mu
				k := w*n + i
				submitted[g] = append(submitted[g], k)
				l.Append([]uint64{g}, []byte(fmt.Sprint(k)), func(r []Result) {
					if r[0].Err != nil {
						events = append(events, "error "+r[0].Err.Error())
						return
					}
					events = append(events, fmt.Sprintf("done %d %d %d", g, r[0].Offset, k))
					if k%50 == 0 { // the log is usable from a callback
						l.Resolve(g, []uint64{r[0].Offset})
						if _, err := l.ReadFrom(g, 0, 3, nil); err != nil {
							events = append(events, "error "+err.Error())
						}
						l.Append([]uint64{3}, nil, func(r []Result) {}) // unknown group, fails in its own callback
					}
				})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	// Sync ran every callback; events is ours now.
	done := map[uint64]uint64{} // group -> offsets seen done
	next := map[uint64]int{}
	for _, e := range events {
		var g, off, k uint64
		switch e[0] {
		case 'd':
			fmt.Sscanf(e, "done %d %d %d", &g, &off, &k)
			if off != done[g]+1 || int(k) != submitted[g][next[g]] {
				t.Fatalf("group %d: %q after offset %d (want submission %d)", g, e, done[g], submitted[g][next[g]])
			}
			done[g] = off
			next[g]++
		case 'h':
			fmt.Sscanf(e, "head %d %d", &g, &off)
			if done[g] < off {
				t.Fatalf("%q before the callback of offset %d", e, off)
			}
		default:
			t.Fatal(e)
		}
	}
	if done[1]+done[2] != 4*n {
		t.Fatalf("callbacks: %v", done)
	}
}

// TestSyncCloseFromCallback: Sync from a callback waits for durability only;
// Close from a callback closes the log without waiting for itself.
func TestSyncCloseFromCallback(t *testing.T) {
	opts := smallOpts(t, t.TempDir())
	l, err := Open(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 4)
	l.Append([]uint64{1}, []byte("a"), func([]Result) {
		l.Append([]uint64{1}, []byte("b"), nil)
		res <- l.SyncFromCallback() // must not wait for the callbacks behind this one
	})
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if gi, _ := l.Group(1); gi.Head != 2 {
		t.Fatalf("Sync from a callback returned before the append it followed was durable: %+v", gi)
	}
	later := make(chan []Result, 1)
	l.Append([]uint64{1}, []byte("c"), func([]Result) {
		res <- l.CloseFromCallback()
		l.Append([]uint64{1}, []byte("d"), func(r []Result) { later <- append([]Result(nil), r...) })
	})
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if r := <-later; !errors.Is(r[0].Err, ErrClosed) {
		t.Fatalf("append after Close: %+v", r)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Sync(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sync after Close: %v", err)
	}
	if _, err := l.ReadFrom(1, 0, 1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadFrom after Close: %v", err)
	}
	// The data is there.
	l2 := openLog(t, opts, map[uint64]GroupState{1: {}})
	if got := readAll(t, l2, 1, 0); len(got) != 3 || string(got[2].Data) != "c" {
		t.Fatalf("after reopen: %v", offsets(got))
	}
}

func TestLockedAndDropped(t *testing.T) {
	opts := smallOpts(t, t.TempDir())
	l := openLog(t, opts, nil)
	if _, err := Open(opts, nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v", err)
	}
	for g := uint64(1); g <= 2; g++ {
		if err := l.AddGroup(g, GroupState{}, Limits{}); err != nil {
			t.Fatal(err)
		}
		appendOK(t, l, g, []byte("x"))
	}
	l.DropGroup(1)
	if r := appendWait(t, l, []uint64{1, 2}, []byte("y")); !errors.Is(r[0].Err, ErrGroupNotFound) || r[1].Offset != 2 {
		t.Fatalf("append to a dropped group: %+v", r)
	}
	if err := l.AddGroup(1, GroupState{}, Limits{}); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("AddGroup of a dropped id: %v", err)
	}
	l = reopen(t, l, &Snapshot{Groups: map[uint64]GroupState{2: {}}})
	if rep := l.Recovery(); rep.Garbage != 1 {
		t.Fatalf("report %+v", rep)
	}
	if err := l.AddGroup(1, GroupState{}, Limits{}); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("AddGroup of an id with records: %v", err)
	}
	if _, err := Open(Options{}, nil); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("Open without a directory: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Dir: file}, nil); !errors.Is(err, ErrUnusable) {
		t.Fatalf("Open of a file: %v", err)
	}
}
