// Package storetest is the contract suite of sessionstore.Store (the
// contract is written in sessionstore/store.go): every implementation runs
// it, the in-memory store (package sessionstore) and the cluster's
// JetStream bucket over a real NATS cluster (package cluster). A store
// that passes it can sit under the broker's session hook.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
	"github.com/keyline-mq/keyline/sessionstore"
)

// Timeout bounds every wait of the suite for a write to reach another
// store of the deployment (a cluster's replicas).
const Timeout = 10 * time.Second

// New returns, for one subtest, the stores of one new, empty deployment:
// one per node (a single node's store may be returned twice), having
// registered their cleanup with t.
type New func(t *testing.T) []sessionstore.Store

// Run runs the contract against the deployments new returns, one per subtest.
func Run(t *testing.T, new New) {
	t.Run("Empty", func(t *testing.T) { testEmpty(t, new(t)) })
	t.Run("CompareAndSet", func(t *testing.T) { testCompareAndSet(t, new(t)) })
	t.Run("Copies", func(t *testing.T) { testCopies(t, new(t)) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, new(t)) })
	t.Run("Race", func(t *testing.T) { testRace(t, new(t)) })
	t.Run("ForEach", func(t *testing.T) { testForEach(t, new(t)) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return c
}

// other returns the store of another node, or the only one.
func other(ss []sessionstore.Store) sessionstore.Store { return ss[len(ss)-1] }

// ids are client ids the stores must take as they are: MQTT allows any
// UTF-8 string but U+0000, up to 65535 bytes.
var ids = []string{"dev-1", "dev.1 *>", "a/b/#", "ünï cødé", strings.Repeat("long", 256)}

func full(id, owner string) *sessionstore.Record {
	return &sessionstore.Record{
		ClientID: id, Owner: owner, Persistent: true, Connected: true,
		Floor: 41, Acked: []uint64{43, 47}, DisconnectedAt: 1_700_000_000,
		State: json.RawMessage(`{"client":{"id":"x"},"subs":[{"filter":"a/#"}]}`),
	}
}

func load(t *testing.T, s sessionstore.Store, id string) (*sessionstore.Record, uint64) {
	t.Helper()
	rec, rev, err := s.Load(ctx(t), id)
	if err != nil {
		t.Fatalf("Load %q: %v", id, err)
	}
	return rec, rev
}

func save(t *testing.T, s sessionstore.Store, rec *sessionstore.Record, rev uint64) uint64 {
	t.Helper()
	nrev, err := s.Save(ctx(t), rec, rev)
	if err != nil {
		t.Fatalf("Save %q at %d: %v", rec.ClientID, rev, err)
	}
	if nrev <= rev {
		t.Fatalf("Save %q at %d: new revision %d does not grow", rec.ClientID, rev, nrev)
	}
	return nrev
}

// awaitRev waits until s returns id's record at revision rev (0: gone).
func awaitRev(t *testing.T, s sessionstore.Store, id string, rev uint64) *sessionstore.Record {
	t.Helper()
	var got *sessionstore.Record
	poll.Until(t, Timeout, fmt.Sprintf("record %q at revision %d", id, rev), func() bool {
		rec, grev, err := s.Load(context.Background(), id)
		if err != nil || grev > rev {
			return false
		}
		got = rec
		return grev == rev && (rev == 0) == (rec == nil)
	})
	return got
}

// testEmpty: no record reads as nil at revision 0; ForEach sees nothing.
func testEmpty(t *testing.T, ss []sessionstore.Store) {
	for _, s := range ss {
		for _, id := range ids {
			if rec, rev := load(t, s, id); rec != nil || rev != 0 {
				t.Errorf("Load %q of an empty store: %+v at %d, want nil at 0", id, rec, rev)
			}
		}
		n := 0
		if err := s.ForEach(ctx(t), func(*sessionstore.Record, uint64) bool { n++; return true }); err != nil || n != 0 {
			t.Errorf("ForEach of an empty store: %d records, %v", n, err)
		}
	}
}

// testCompareAndSet: create only when absent, replace only at the revision
// read, every field kept, a write seen by the writer at once and by the
// deployment's other stores eventually.
func testCompareAndSet(t *testing.T, ss []sessionstore.Store) {
	a, b := ss[0], other(ss)
	for _, id := range ids {
		rec := full(id, "node-a")
		rev := save(t, a, rec, 0)
		if _, err := b.Save(ctx(t), rec, 0); !errors.Is(err, sessionstore.ErrRevision) {
			t.Fatalf("second create of %q: %v, want ErrRevision", id, err)
		}
		got, grev := load(t, a, id)
		if grev != rev || !reflect.DeepEqual(got, rec) {
			t.Fatalf("Load %q after Save by the same store: %+v at %d, want %+v at %d", id, got, grev, rec, rev)
		}
		if got := awaitRev(t, b, id, rev); !reflect.DeepEqual(got, rec) {
			t.Fatalf("Load %q by another store: %+v, want %+v", id, got, rec)
		}
		upd := full(id, "node-b")
		upd.Connected, upd.Floor, upd.Acked, upd.State = false, 50, nil, nil
		rev2 := save(t, b, upd, rev)
		if _, err := a.Save(ctx(t), rec, rev); !errors.Is(err, sessionstore.ErrRevision) {
			t.Fatalf("stale writer of %q: %v, want ErrRevision", id, err)
		}
		if _, err := a.Save(ctx(t), rec, rev2+1000); !errors.Is(err, sessionstore.ErrRevision) {
			t.Fatalf("writer of %q at a revision never written: %v, want ErrRevision", id, err)
		}
		if got := awaitRev(t, a, id, rev2); !reflect.DeepEqual(got, upd) {
			t.Fatalf("Load %q after the update: %+v, want %+v", id, got, upd)
		}
	}
}

// testCopies: what Load and ForEach return, and what Save was given, are
// not the store's.
func testCopies(t *testing.T, ss []sessionstore.Store) {
	s := ss[0]
	rec := full("copy", "n")
	rev := save(t, s, rec, 0)
	rec.Acked[0], rec.State[0], rec.Owner = 99, 'X', "changed"
	got, _ := load(t, s, "copy")
	if want := full("copy", "n"); !reflect.DeepEqual(got, want) {
		t.Fatalf("record changed through the slice given to Save: %+v", got)
	}
	got.Acked[0], got.State[0] = 98, 'Y'
	if err := s.ForEach(ctx(t), func(r *sessionstore.Record, _ uint64) bool {
		r.Acked[0] = 97
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if again, arev := load(t, s, "copy"); arev != rev || !reflect.DeepEqual(again, full("copy", "n")) {
		t.Fatalf("record changed through what Load or ForEach returned: %+v at %d", again, arev)
	}
}

// testDelete: only at the revision read; a deleted record reads as none
// and can be created again, at a higher revision.
func testDelete(t *testing.T, ss []sessionstore.Store) {
	a, b := ss[0], other(ss)
	rec := full("gone", "node-a")
	rev := save(t, a, rec, 0)
	rev2 := save(t, a, rec, rev)
	if err := b.Delete(ctx(t), "gone", rev); !errors.Is(err, sessionstore.ErrRevision) {
		t.Fatalf("Delete at a stale revision: %v, want ErrRevision", err)
	}
	if err := b.Delete(ctx(t), "gone", rev2); err != nil {
		t.Fatalf("Delete at the revision read: %v", err)
	}
	awaitRev(t, a, "gone", 0)
	awaitRev(t, b, "gone", 0)
	if err := a.Delete(ctx(t), "gone", rev2); !errors.Is(err, sessionstore.ErrRevision) {
		t.Fatalf("Delete of a deleted record: %v, want ErrRevision", err)
	}
	if rev3 := save(t, a, rec, 0); rev3 <= rev2 {
		t.Fatalf("record created again at revision %d, not above %d", rev3, rev2)
	}
}

// testRace: of writers racing at one revision, through every store of the
// deployment, exactly one wins, and the record is the winner's.
func testRace(t *testing.T, ss []sessionstore.Store) {
	rev := save(t, ss[0], full("raced", "none"), 0)
	for _, s := range ss {
		awaitRev(t, s, "raced", rev)
	}
	const writers = 8
	var wg sync.WaitGroup
	errs := make([]error, writers)
	revs := make([]uint64, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			revs[i], errs[i] = ss[i%len(ss)].Save(ctx(t), full("raced", fmt.Sprint("w", i)), rev)
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("writers %d and %d both won at revision %d", winner, i, rev)
		case err == nil:
			winner = i
		case !errors.Is(err, sessionstore.ErrRevision):
			t.Fatalf("writer %d: %v, want success or ErrRevision", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no writer won")
	}
	if got := awaitRev(t, ss[0], "raced", revs[winner]); got.Owner != fmt.Sprint("w", winner) {
		t.Fatalf("record names %q, want the winner w%d", got.Owner, winner)
	}
}

// testForEach: every record with its revision; it stops when fn says so.
func testForEach(t *testing.T, ss []sessionstore.Store) {
	s := ss[0]
	want := map[string]uint64{}
	for i := range 20 {
		id := fmt.Sprintf("each-%02d", i)
		want[id] = save(t, s, full(id, "n"), 0)
	}
	got := map[string]uint64{}
	poll.Until(t, Timeout, "ForEach to list every record", func() bool {
		clear(got)
		err := s.ForEach(ctx(t), func(r *sessionstore.Record, rev uint64) bool {
			got[r.ClientID] = rev
			return true
		})
		return err == nil && reflect.DeepEqual(got, want)
	})
	calls := 0
	if err := s.ForEach(ctx(t), func(*sessionstore.Record, uint64) bool { calls++; return false }); err != nil || calls != 1 {
		t.Fatalf("ForEach after fn returned false: %d calls, %v; want 1", calls, err)
	}
}

// Reopen returns, for one subtest, a function that opens the store of one
// new, empty deployment on what it keeps: called again, it closes the store
// it returned last (as a process ends) and opens it again.
type Reopen func(t *testing.T) func() sessionstore.Store

// RunDurable runs the contract's durability part against stores that keep
// their records across a close and a reopen (the data file's): every write
// that returned is there after it, at its revision, and revisions keep
// growing, so a writer holding a revision from before the reopen still
// decides against what was written.
func RunDurable(t *testing.T, reopen Reopen) {
	t.Run("Reopen", func(t *testing.T) {
		open := reopen(t)
		s := open()
		revs := map[string]uint64{}
		var top uint64
		for _, id := range ids {
			revs[id] = save(t, s, full(id, "node-a"), 0)
			top = max(top, revs[id])
		}
		rec := full(ids[0], "node-b")
		rec.Acked, rec.State = nil, nil
		revs[ids[0]] = save(t, s, rec, revs[ids[0]])
		if err := s.Delete(ctx(t), ids[1], revs[ids[1]]); err != nil {
			t.Fatalf("Delete %q: %v", ids[1], err)
		}
		delete(revs, ids[1])
		stale := revs[ids[2]]
		revs[ids[2]] = save(t, s, full(ids[2], "node-c"), stale)
		for _, rev := range revs {
			top = max(top, rev)
		}

		s = open()
		for _, id := range ids {
			got, rev := load(t, s, id)
			want := full(id, "node-a")
			switch id {
			case ids[0]:
				want = rec
			case ids[1]:
				want = nil
			case ids[2]:
				want = full(id, "node-c")
			}
			if rev != revs[id] || !reflect.DeepEqual(got, want) {
				t.Fatalf("after reopen, %q: %+v at %d, want %+v at %d", id, got, rev, want, revs[id])
			}
		}
		n := 0
		if err := s.ForEach(ctx(t), func(r *sessionstore.Record, rev uint64) bool {
			n++
			if rev != revs[r.ClientID] {
				t.Errorf("ForEach after reopen: %q at %d, want %d", r.ClientID, rev, revs[r.ClientID])
			}
			return true
		}); err != nil || n != len(revs) {
			t.Fatalf("ForEach after reopen: %d records, %v; want %d", n, err, len(revs))
		}
		if _, err := s.Save(ctx(t), full(ids[2], "late"), stale); !errors.Is(err, sessionstore.ErrRevision) {
			t.Fatalf("Save at a revision from before a write, after reopen: %v, want ErrRevision", err)
		}
		if rev := save(t, s, full(ids[1], "node-a"), 0); rev <= top {
			t.Fatalf("revision %d after reopen, not above %d from before", rev, top)
		}
	})
}
