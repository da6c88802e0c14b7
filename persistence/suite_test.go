package persistence

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
)

// The store suite runs every test against every GroupStore implementation and
// sync mode (nats-server's testAllStoreAllPermutations).

// harness is one store under test.
type harness struct {
	s GroupStore
	// persistent stores survive reopen; for the others reopen does nothing.
	persistent bool
	reopen     func()
	close      func()
}

type storeImpl struct {
	name string
	open func(t *testing.T) *harness
}

var storeImpls = []storeImpl{
	{"bolt-fsync", func(t *testing.T) *harness { return boltHarness(t, Options{}) }},
	{"bolt-nosync", func(t *testing.T) *harness { return boltHarness(t, Options{NoSync: true}) }},
	{"mem", func(t *testing.T) *harness {
		s := NewMemGroups()
		t.Cleanup(func() { s.Close() })
		return &harness{s: s, reopen: func() {}, close: func() { s.Close() }}
	}},
}

func boltHarness(t *testing.T, opts Options) *harness {
	dir := t.TempDir()
	db := openTestDB(t, dir, opts)
	h := &harness{s: db.Groups(), persistent: true}
	h.reopen = func() {
		if err := db.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		db = openTestDB(t, dir, opts)
		h.s = db.Groups()
	}
	h.close = func() {
		if err := db.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	return h
}

var storeTests = []struct {
	name string
	fn   func(t *testing.T, h *harness)
}{
	{"AppendRead", testAppendRead},
	{"ConcurrentOffsets", testConcurrentOffsets},
	{"Resolve", testResolve},
	{"BacklogReject", testBacklogReject},
	{"DropOldest", testDropOldest},
	{"AppendMulti", testAppendMulti},
	{"AsyncOrderNotify", testAsyncOrderNotify},
	{"DeadLetters", testDeadLetters},
	{"Lifecycle", testLifecycle},
	{"IdleSweep", testIdleSweep},
	{"GroupNames", testGroupNames},
	{"Closed", testClosed},
}

func TestStore(t *testing.T) {
	for _, impl := range storeImpls {
		t.Run(impl.name, func(t *testing.T) {
			for _, tc := range storeTests {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, impl.open(t)) })
			}
		})
	}
}

func ensure(t *testing.T, s GroupStore, name string, cfg GroupConfig) keyshared.Log {
	t.Helper()
	if _, err := s.EnsureGroup(name, cfg); err != nil {
		t.Fatalf("EnsureGroup(%q): %v", name, err)
	}
	l, err := s.Log(name)
	if err != nil {
		t.Fatalf("Log(%q): %v", name, err)
	}
	return l
}

func mustAppend(t *testing.T, s GroupStore, group string, m keyshared.Message) uint64 {
	t.Helper()
	off, err := s.Append(group, m)
	if err != nil {
		t.Fatalf("Append(%q): %v", group, err)
	}
	return off
}

func mustInfo(t *testing.T, s GroupStore, group string) GroupInfo {
	t.Helper()
	info, err := s.Group(group)
	if err != nil {
		t.Fatalf("Group(%q): %v", group, err)
	}
	return info
}

func mustFlush(t *testing.T, s GroupStore) {
	t.Helper()
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// readAll reads the whole log from offset from.
func readAll(t *testing.T, l keyshared.Log, from uint64) []keyshared.Message {
	t.Helper()
	var out []keyshared.Message
	for {
		n := len(out)
		var err error
		out, err = l.ReadFrom(from, 3, out)
		if err != nil {
			t.Fatalf("ReadFrom(%d): %v", from, err)
		}
		if len(out) == n {
			return out
		}
		from = out[len(out)-1].Offset + 1
	}
}

func offsets(ms []keyshared.Message) []uint64 {
	out := make([]uint64, len(ms))
	for i := range ms {
		out[i] = ms[i].Offset
	}
	return out
}

func seq(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func testAppendRead(t *testing.T, h *harness) {
	const g = "workers/orders/#"
	l := ensure(t, h.s, g, GroupConfig{})
	if l.Head() != 0 {
		t.Fatalf("Head of a new group = %d, want 0", l.Head())
	}
	want := []keyshared.Message{
		fullMsg(1),
		msg("plain/topic", "hello"),
		{Topic: "empty", Key: "k"}, // no payload, zero times
		fullMsg(2),
	}
	want[3].Payload = make([]byte, 70_000)
	for i := range want[3].Payload {
		want[3].Payload[i] = byte(i)
	}
	for i, m := range want {
		m.Offset = 99 // ignored
		if off := mustAppend(t, h.s, g, m); off != uint64(i+1) {
			t.Fatalf("append %d: offset %d, want %d", i, off, i+1)
		}
	}
	check := func() {
		t.Helper()
		if l.Head() != 4 {
			t.Fatalf("Head = %d, want 4", l.Head())
		}
		got := readAll(t, l, 0)
		if len(got) != len(want) {
			t.Fatalf("read %d messages, want %d", len(got), len(want))
		}
		for i := range got {
			if d := sameMessage(got[i], want[i], uint64(i+1)); d != "" {
				t.Fatalf("message %d: %s", i+1, d)
			}
		}
		buf := make([]keyshared.Message, 1, 8)
		buf, err := l.ReadFrom(2, 1, buf)
		if err != nil || len(buf) != 2 || buf[1].Offset != 2 {
			t.Fatalf("ReadFrom(2, 1) onto one element = %v, %v; want it extended by offset 2", offsets(buf), err)
		}
		if rest, err := l.ReadFrom(5, 10, nil); err != nil || len(rest) != 0 {
			t.Fatalf("ReadFrom(past head) = %v, %v", offsets(rest), err)
		}
		if none, err := l.ReadFrom(1, 0, nil); err != nil || len(none) != 0 {
			t.Fatalf("ReadFrom(max 0) = %v, %v", offsets(none), err)
		}
		info := mustInfo(t, h.s, g)
		if info.Head != 4 || info.Backlog != 4 || info.StoredMessages != 4 || info.Share != "workers" || info.Filter != "orders/#" {
			t.Fatalf("info = %+v", info)
		}
		var size uint64
		for i := range want {
			size += uint64(keyshared.MessageSize(&want[i]))
		}
		if info.StoredBytes != size {
			t.Fatalf("StoredBytes = %d, want %d", info.StoredBytes, size)
		}
	}
	check()
	h.reopen()
	l, _ = h.s.Log(g)
	check()
}

func testConcurrentOffsets(t *testing.T, h *harness) {
	const g = "c/#"
	l := ensure(t, h.s, g, GroupConfig{})
	const workers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	results := make([][]uint64, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mu sync.Mutex
			for i := range each {
				m := msg("t", fmt.Sprintf("%d-%d", w, i))
				if w%2 == 0 {
					off, err := h.s.Append(g, m)
					if err != nil {
						errs <- err
						return
					}
					results[w] = append(results[w], off)
					continue
				}
				done := make(chan struct{})
				h.s.AppendAsync(g, m, func(off uint64, err error) {
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs <- err
					}
					results[w] = append(results[w], off)
					close(done)
				})
				if i%5 == 4 { // let a few be outstanding at once
					<-done
				}
			}
		}()
	}
	wg.Wait()
	mustFlush(t, h.s)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []uint64
	for w, offs := range results {
		if !slices.IsSorted(offs) {
			t.Errorf("worker %d saw offsets out of order: %v", w, offs)
		}
		all = append(all, offs...)
	}
	slices.Sort(all)
	if !slices.Equal(all, seq(1, workers*each)) {
		t.Fatalf("offsets are not 1..%d exactly once: %v", workers*each, all)
	}
	// Each worker's messages appear in its own order.
	last := map[int]int{}
	for _, m := range readAll(t, l, 1) {
		var w, i int
		fmt.Sscanf(string(m.Payload), "%d-%d", &w, &i)
		if prev, ok := last[w]; ok && i <= prev {
			t.Fatalf("worker %d: message %d after %d", w, i, prev)
		}
		last[w] = i
	}
}

// testResolve: resolved offsets never come back, in or out of order, also
// after a reopen; the cursor passes what is resolved contiguously.
func testResolve(t *testing.T, h *harness) {
	const g = "trim/#"
	l := ensure(t, h.s, g, GroupConfig{})
	for i := range 10 {
		mustAppend(t, h.s, g, msg("t", fmt.Sprint(i)))
	}
	if c, err := l.LoadCursor(); err != nil || c != 0 {
		t.Fatalf("LoadCursor of a new group = %d, %v", c, err)
	}
	l.Resolve([]uint64{1, 2, 3, 4, 7})
	l.Resolve([]uint64{3, 99}) // again, and past the head: ignored
	mustFlush(t, h.s)
	info := mustInfo(t, h.s, g)
	if info.Cursor != 4 || info.Backlog != 5 || info.StoredMessages != 5 || info.Head != 10 {
		t.Fatalf("after resolving 1-4 and 7: %+v", info)
	}
	want := []uint64{5, 6, 8, 9, 10}
	if got := offsets(readAll(t, l, 1)); !slices.Equal(got, want) {
		t.Fatalf("unresolved = %v, want %v", got, want)
	}
	h.reopen()
	l, _ = h.s.Log(g)
	if c, err := l.LoadCursor(); err != nil || c != 4 {
		t.Fatalf("LoadCursor after reopen = %d, %v", c, err)
	}
	if got := offsets(readAll(t, l, 1)); !slices.Equal(got, want) {
		t.Fatalf("unresolved after reopen = %v, want %v (7 was resolved above the cursor)", got, want)
	}
	l.Resolve(want)
	mustFlush(t, h.s)
	info = mustInfo(t, h.s, g)
	if info.Backlog != 0 || info.StoredMessages != 0 || info.StoredBytes != 0 || info.Head != 10 || info.Cursor != 10 {
		t.Fatalf("after resolving everything: %+v", info)
	}
	if off := mustAppend(t, h.s, g, msg("t", "x")); off != 11 {
		t.Fatalf("offset after a fully resolved log = %d, want 11 (offsets are never reused)", off)
	}
	h.reopen()
	if off := mustAppend(t, h.s, g, msg("t", "y")); off != 12 {
		t.Fatalf("offset after reopen = %d, want 12", off)
	}
}

func testBacklogReject(t *testing.T, h *harness) {
	const g = "limits/#"
	l := ensure(t, h.s, g, GroupConfig{MaxMessages: 3})
	for range 3 {
		mustAppend(t, h.s, g, msg("t", "x"))
	}
	_, err := h.s.Append(g, msg("t", "x"))
	if !errors.Is(err, ErrBacklogFull) || !strings.HasPrefix(err.Error(), "keyshared: group backlog full") {
		t.Fatalf("append over the message limit = %v, want ErrBacklogFull", err)
	}
	if info := mustInfo(t, h.s, g); info.Rejected != 1 || info.Head != 3 {
		t.Fatalf("after rejection: %+v", info)
	}
	// An ack makes room at once.
	l.Resolve([]uint64{1})
	if off := mustAppend(t, h.s, g, msg("t", "x")); off != 4 {
		t.Fatalf("offset = %d", off)
	}

	// Byte limit.
	m := msg("t", strings.Repeat("b", 100))
	size := uint64(keyshared.MessageSize(&m))
	const gb = "bytes/#"
	ensure(t, h.s, gb, GroupConfig{MaxBytes: 2*size + 1})
	mustAppend(t, h.s, gb, m)
	mustAppend(t, h.s, gb, m)
	if _, err := h.s.Append(gb, m); !errors.Is(err, ErrBacklogFull) {
		t.Fatalf("append over the byte limit = %v", err)
	}
	// A message larger than the limit is refused under either policy.
	if _, err := h.s.EnsureGroup(gb, GroupConfig{MaxBytes: 2*size + 1, Policy: PolicyDropOldest}); err != nil {
		t.Fatal(err)
	}
	big := msg("t", strings.Repeat("b", int(3*size)))
	if _, err := h.s.Append(gb, big); !errors.Is(err, ErrBacklogFull) {
		t.Fatalf("oversized message under drop-oldest = %v", err)
	}
	if info := mustInfo(t, h.s, gb); info.Head != 2 || info.Dropped != 0 || info.Rejected != 2 {
		t.Fatalf("after oversized: %+v", info)
	}
}

func testDropOldest(t *testing.T, h *harness) {
	const g = "drop/#"
	l := ensure(t, h.s, g, GroupConfig{MaxMessages: 3, Policy: PolicyDropOldest})
	for i := range 5 {
		if off := mustAppend(t, h.s, g, msg("t", fmt.Sprint(i))); off != uint64(i+1) {
			t.Fatalf("offset %d, want %d", off, i+1)
		}
	}
	if got := offsets(readAll(t, l, 1)); !slices.Equal(got, []uint64{3, 4, 5}) {
		t.Fatalf("log = %v, want [3 4 5]", got)
	}
	if info := mustInfo(t, h.s, g); info.Dropped != 2 || info.Backlog != 3 || info.Head != 5 {
		t.Fatalf("info = %+v", info)
	}
	// Resolved entries make room before anything unresolved is dropped.
	l.Resolve([]uint64{3, 4})
	mustAppend(t, h.s, g, msg("t", "6"))
	mustAppend(t, h.s, g, msg("t", "7"))
	if info := mustInfo(t, h.s, g); info.Dropped != 2 {
		t.Fatalf("dropped after acks = %d, want 2", info.Dropped)
	}
	mustAppend(t, h.s, g, msg("t", "8"))
	if got := offsets(readAll(t, l, 1)); !slices.Equal(got, []uint64{6, 7, 8}) {
		t.Fatalf("log = %v, want [6 7 8]", got)
	}
	h.reopen()
	if info := mustInfo(t, h.s, g); info.Dropped != 3 || info.Head != 8 || info.Cursor != 5 {
		t.Fatalf("after reopen: %+v", info)
	}
}

func testAppendMulti(t *testing.T, h *harness) {
	ensure(t, h.s, "a/#", GroupConfig{})
	ensure(t, h.s, "b/#", GroupConfig{MaxMessages: 1})
	groups := []string{"a/#", "b/#", "c/#"}
	check := func(res []AppendResult, wantA uint64, wantB error) {
		t.Helper()
		if len(res) != 3 || res[0].Group != "a/#" || res[1].Group != "b/#" || res[2].Group != "c/#" {
			t.Fatalf("results = %+v", res)
		}
		if res[0].Err != nil || res[0].Offset != wantA {
			t.Fatalf("a: %+v, want offset %d", res[0], wantA)
		}
		if (wantB == nil && (res[1].Err != nil || res[1].Offset != 1)) || (wantB != nil && !errors.Is(res[1].Err, wantB)) {
			t.Fatalf("b: %+v, want %v", res[1], wantB)
		}
		if !errors.Is(res[2].Err, ErrGroupNotFound) {
			t.Fatalf("c: %+v, want ErrGroupNotFound", res[2])
		}
	}
	check(h.s.AppendMulti(groups, msg("x", "1")), 1, nil)
	ch := make(chan []AppendResult, 1)
	h.s.AppendMultiAsync(groups, msg("x", "2"), func(r []AppendResult) { ch <- r })
	groups[0] = "changed after the call" // the store must have taken a copy
	check(<-ch, 2, ErrBacklogFull)
}

func testAsyncOrderNotify(t *testing.T, h *harness) {
	const g = "async/#"
	l := ensure(t, h.s, g, GroupConfig{})
	type note struct {
		group string
		head  uint64
	}
	var mu sync.Mutex
	var notes []note
	h.s.OnAppend(func(group string, head uint64) {
		mu.Lock()
		notes = append(notes, note{group, head})
		mu.Unlock()
	})
	const n = 200
	var got []uint64 // written only by callbacks, which run one at a time
	errs := make(chan error, n)
	for i := range n {
		h.s.AppendAsync(g, msg("t", fmt.Sprint(i)), func(off uint64, err error) {
			if err != nil {
				errs <- err
				return
			}
			// The entry is committed and readable when the callback runs, and the
			// callback may call the store.
			ms, err := l.ReadFrom(off, 1, nil)
			if err != nil || len(ms) != 1 || string(ms[0].Payload) != fmt.Sprint(i) {
				errs <- fmt.Errorf("callback for %d: read %v, %v", off, ms, err)
			}
			got = append(got, off)
		})
	}
	mustFlush(t, h.s)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !slices.Equal(got, seq(1, n)) {
		t.Fatalf("callback offsets = %v, want 1..%d in order", got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(notes) == 0 || notes[len(notes)-1] != (note{g, n}) {
		t.Fatalf("notifications = %v, want the last to be {%s %d}", notes, g, n)
	}
	for i := 1; i < len(notes); i++ {
		if notes[i].head <= notes[i-1].head {
			t.Fatalf("notifications out of order: %v", notes)
		}
	}
	h.s.OnAppend(nil)
	mustAppend(t, h.s, g, msg("t", "quiet"))
	mustFlush(t, h.s)
	if notes[len(notes)-1].head != n {
		t.Fatalf("notified after OnAppend(nil): %v", notes[len(notes)-1])
	}
}

func testDeadLetters(t *testing.T, h *harness) {
	const g = "dlq/#"
	l := ensure(t, h.s, g, GroupConfig{MaxMessages: 3})
	for i := range 3 {
		mustAppend(t, h.s, g, fullMsg(i))
	}
	ms := readAll(t, l, 1)
	t0 := time.Unix(1_750_000_000, 5)
	for i, m := range ms[:2] {
		d := keyshared.DeadLetter{Group: "ignored", Message: m, Attempts: 5 + i, Reason: 0x99,
			FirstDelivery: t0, LastDelivery: t0.Add(time.Second), DeadAt: t0.Add(2 * time.Second)}
		if err := l.DeadLetter(d); err != nil {
			t.Fatal(err)
		}
	}
	l.Resolve([]uint64{1, 2})
	if info := mustInfo(t, h.s, g); info.DeadLetters != 2 {
		t.Fatalf("DeadLetters = %d", info.DeadLetters)
	}
	// Paging.
	var ids []uint64
	for after := uint64(0); ; {
		page, err := h.s.DeadLetters(g, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		ids = append(ids, page[0].ID)
		after = page[0].ID
	}
	if !slices.Equal(ids, []uint64{1, 2}) {
		t.Fatalf("paged ids = %v", ids)
	}
	e, err := h.s.DeadLetter(g, 2)
	if err != nil {
		t.Fatal(err)
	}
	if e.Group != g || e.Attempts != 6 || e.Reason != 0x99 || !e.FirstDelivery.Equal(t0) ||
		!e.LastDelivery.Equal(t0.Add(time.Second)) || !e.DeadAt.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("dead letter = %+v", e)
	}
	if d := sameMessage(e.Message, fullMsg(1), 2); d != "" {
		t.Fatalf("dead letter message: %s", d)
	}
	h.reopen()
	l, _ = h.s.Log(g)

	// Replay appends at the tail and removes the dead letter.
	off, err := h.s.ReplayDeadLetter(g, 1)
	if err != nil || off != 4 {
		t.Fatalf("ReplayDeadLetter = %d, %v; want 4", off, err)
	}
	got, err := l.ReadFrom(4, 1, nil)
	if err != nil || len(got) != 1 {
		t.Fatalf("ReadFrom(4) = %v, %v", got, err)
	}
	if d := sameMessage(got[0], fullMsg(0), 4); d != "" {
		t.Fatalf("replayed message: %s", d)
	}
	if _, err := h.s.DeadLetter(g, 1); !errors.Is(err, ErrDeadLetterNotFound) {
		t.Fatalf("replayed dead letter still there: %v", err)
	}
	// Replay obeys the backlog limit and keeps the dead letter when refused.
	mustAppend(t, h.s, g, msg("t", "fill"))
	if _, err := h.s.ReplayDeadLetter(g, 2); !errors.Is(err, ErrBacklogFull) {
		t.Fatalf("replay into a full group = %v", err)
	}
	if _, err := h.s.DeadLetter(g, 2); err != nil {
		t.Fatalf("refused replay lost the dead letter: %v", err)
	}
	if err := h.s.DeleteDeadLetter(g, 2); err != nil {
		t.Fatal(err)
	}
	if err := h.s.DeleteDeadLetter(g, 2); !errors.Is(err, ErrDeadLetterNotFound) {
		t.Fatalf("second delete = %v", err)
	}
	if _, err := h.s.ReplayDeadLetter(g, 9); !errors.Is(err, ErrDeadLetterNotFound) {
		t.Fatalf("replay of unknown id = %v", err)
	}
	for _, m := range got {
		if err := l.DeadLetter(keyshared.DeadLetter{Message: m}); err != nil {
			t.Fatal(err)
		}
		if err := l.DeadLetter(keyshared.DeadLetter{Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := h.s.PurgeDeadLetters(g); n != 2 || err != nil {
		t.Fatalf("PurgeDeadLetters = %d, %v", n, err)
	}
	if err := l.DeadLetter(keyshared.DeadLetter{Message: got[0]}); err != nil {
		t.Fatal(err)
	}
	page, err := h.s.DeadLetters(g, 0, 10)
	if err != nil || len(page) != 1 || page[0].ID != 5 {
		t.Fatalf("after purge: %+v, %v (ids are never reused)", page, err)
	}
	if info := mustInfo(t, h.s, g); info.DeadLetters != 1 {
		t.Fatalf("DeadLetters = %d", info.DeadLetters)
	}
	if _, err := h.s.DeadLetters("nope/#", 0, 10); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("DeadLetters of unknown group = %v", err)
	}
}

func testLifecycle(t *testing.T, h *harness) {
	created, err := h.s.EnsureGroup("b/x", GroupConfig{})
	if err != nil || !created {
		t.Fatalf("EnsureGroup = %v, %v", created, err)
	}
	cfg := GroupConfig{MaxMessages: 10, MaxBytes: 1 << 20, Policy: PolicyDropOldest}
	created, err = h.s.EnsureGroup("b/x", cfg)
	if err != nil || created {
		t.Fatalf("second EnsureGroup = %v, %v", created, err)
	}
	if _, err := h.s.EnsureGroup("a/y", GroupConfig{Policy: 7}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("bad policy = %v", err)
	}
	ensure(t, h.s, "a/y", GroupConfig{})
	ensure(t, h.s, "c/z/+", GroupConfig{})
	mustAppend(t, h.s, "c/z/+", msg("z/1", "x"))
	h.reopen()
	list, err := h.s.Groups()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range list {
		names = append(names, g.Name)
		if g.Created.IsZero() || g.LastSeen.IsZero() {
			t.Errorf("%s: created %v, last seen %v", g.Name, g.Created, g.LastSeen)
		}
	}
	if !slices.Equal(names, []string{"a/y", "b/x", "c/z/+"}) {
		t.Fatalf("Groups = %v", names)
	}
	if list[1].Config != cfg {
		t.Fatalf("config = %+v, want %+v", list[1].Config, cfg)
	}
	l, err := h.s.Log("c/z/+")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.s.DeleteGroup("c/z/+"); err != nil {
		t.Fatal(err)
	}
	if err := h.s.DeleteGroup("c/z/+"); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("second delete = %v", err)
	}
	if _, err := h.s.Group("c/z/+"); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("Group after delete = %v", err)
	}
	if _, err := h.s.Append("c/z/+", msg("z/1", "x")); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("Append after delete = %v", err)
	}
	if _, err := l.ReadFrom(1, 1, nil); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("ReadFrom after delete = %v", err)
	}
	l.Resolve([]uint64{1}) // of a deleted group: ignored
	// A new group of the same name starts afresh.
	ensure(t, h.s, "c/z/+", GroupConfig{})
	if off := mustAppend(t, h.s, "c/z/+", msg("z/1", "x")); off != 1 {
		t.Fatalf("first offset of recreated group = %d", off)
	}
	h.reopen()
	if info := mustInfo(t, h.s, "c/z/+"); info.Head != 1 {
		t.Fatalf("recreated group after reopen: %+v", info)
	}
}

func testIdleSweep(t *testing.T, h *harness) {
	t0 := time.Now()
	ensure(t, h.s, "a/#", GroupConfig{})
	ensure(t, h.s, "b/#", GroupConfig{}) // never has members: idle since creation
	ensure(t, h.s, "c/#", GroupConfig{})
	ensure(t, h.s, "d/#", GroupConfig{}) // holds a message: never swept
	mustAppend(t, h.s, "d/#", msg("d/1", "x"))
	dl := ensure(t, h.s, "e/#", GroupConfig{}) // holds a dead letter: never swept
	if err := dl.DeadLetter(keyshared.DeadLetter{Message: keyshared.Message{Topic: "e/1", Key: "e/1"}}); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(h.s.MembersChanged("a/#", 2, t0))
	must(h.s.MembersChanged("c/#", 1, t0))
	must(h.s.MembersChanged("c/#", 0, t0.Add(time.Minute)))
	must(h.s.MembersChanged("c/#", 0, t0.Add(90*time.Second))) // still none: the TTL keeps counting
	if err := h.s.MembersChanged("x/#", 1, t0); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("MembersChanged on unknown group = %v", err)
	}
	sweep := func(at time.Duration, want ...string) {
		t.Helper()
		got, err := h.s.SweepIdle(t0.Add(at), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("SweepIdle at +%v = %v, want %v", at, got, want)
		}
	}
	sweep(30 * time.Second)
	if info := mustInfo(t, h.s, "a/#"); info.Members != 2 {
		t.Fatalf("Members = %d", info.Members)
	}
	sweep(2*time.Minute, "b/#", "c/#")
	must(h.s.MembersChanged("a/#", 0, t0.Add(2*time.Minute)))
	sweep(2*time.Minute + 59*time.Second)
	sweep(3*time.Minute, "a/#")
	if list, err := h.s.Groups(); err != nil || len(list) != 2 || list[0].Name != "d/#" || list[1].Name != "e/#" {
		t.Fatalf("groups left: %v, %v; want d/# and e/#, which hold messages", list, err)
	}
}

// Group names are bucket keys, never paths: anything an MQTT share name and
// filter may hold works.
func testGroupNames(t *testing.T, h *harness) {
	odd := []string{
		"wörkers/orders/#",
		"a/ b /c",
		"🚀/x/+/y",
		"a/../../etc/passwd",
		"s/line\nbreak\ttab",
		"s/%00%n%s\\x",
		"s/$SYS/#",
		"s//",
		"s/" + strings.Repeat("ж", 8000),
	}
	for i, name := range odd {
		ensure(t, h.s, name, GroupConfig{})
		if off := mustAppend(t, h.s, name, msg(name, fmt.Sprint(i))); off != 1 {
			t.Fatalf("%q: offset %d", name, off)
		}
	}
	check := func() {
		t.Helper()
		list, err := h.s.Groups()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, g := range list {
			names = append(names, g.Name)
		}
		want := slices.Clone(odd)
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Fatalf("Groups = %q, want %q", names, want)
		}
		for i, name := range odd {
			l, err := h.s.Log(name)
			if err != nil {
				t.Fatal(err)
			}
			ms := readAll(t, l, 1)
			if len(ms) != 1 || ms[0].Topic != name || string(ms[0].Payload) != fmt.Sprint(i) {
				t.Fatalf("%q: read %v", name, ms)
			}
		}
	}
	check()
	h.reopen()
	check()
	bad := []string{"", "noslash", "/filter", "share/", "sh+are/x", "sh#re/x", "a/nul\x00", "a/\xff\xfe",
		"s/" + strings.Repeat("x", MaxGroupNameLen)}
	for _, name := range bad {
		_, err := h.s.EnsureGroup(name, GroupConfig{})
		if !errors.Is(err, ErrBadGroupName) || !strings.HasPrefix(err.Error(), "keyshared: invalid group name") {
			t.Errorf("EnsureGroup(%.40q) = %v, want ErrBadGroupName", name, err)
		}
	}
}

func testClosed(t *testing.T, h *harness) {
	const g = "closed/#"
	l := ensure(t, h.s, g, GroupConfig{})
	mustAppend(t, h.s, g, msg("t", "x"))
	// Async appends submitted before Close are committed and called back.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range 20 {
		wg.Add(1)
		h.s.AppendAsync(g, msg("t", "y"), func(_ uint64, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			wg.Done()
		})
	}
	h.close()
	wg.Wait()
	if errs := errors.Join(errs...); errs != nil {
		t.Fatalf("appends submitted before Close: %v", errs)
	}
	if _, err := h.s.Append(g, msg("t", "x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close = %v", err)
	}
	var cbErr error
	h.s.AppendAsync(g, msg("t", "x"), func(_ uint64, err error) { cbErr = err })
	if !errors.Is(cbErr, ErrClosed) {
		t.Fatalf("AppendAsync after Close called back with %v", cbErr)
	}
	if _, err := h.s.Group(g); !errors.Is(err, ErrClosed) {
		t.Fatalf("Group after Close = %v", err)
	}
	if _, err := l.ReadFrom(1, 1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadFrom after Close = %v", err)
	}
	if err := h.s.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close = %v", err)
	}
	if h.persistent {
		h.reopen()
		if info := mustInfo(t, h.s, g); info.Head != 21 {
			t.Fatalf("head after reopen = %d, want 21", info.Head)
		}
	}
}
