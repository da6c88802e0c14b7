package persistence

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

func openSessionsForTest(t *testing.T, dir string) (*DB, *SessionStore) {
	t.Helper()
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	s, err := db.OpenSessions()
	if err != nil {
		db.Close()
		t.Fatalf("open sessions: %v", err)
	}
	return db, s
}

func collect(t *testing.T, s *SessionStore, kind string) map[string]string {
	t.Helper()
	got := map[string]string{}
	if err := s.ForEach(kind, func(k, v []byte) error {
		got[string(k)] = string(v)
		return nil
	}); err != nil {
		t.Fatalf("ForEach %s: %v", kind, err)
	}
	return got
}

func TestSessionStoreWritesSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	db, s := openSessionsForTest(t, dir)
	s.Put(KindSysInfo, []byte("c1"), []byte("v1"))
	s.Put(KindSysInfo, []byte("c2"), []byte("v2"))
	s.Put(KindSysInfo, []byte("c1"), []byte("v1b")) // later write wins
	s.Delete(KindSysInfo, []byte("c2"))
	s.Put(KindInflight, []byte("\x02c1\x00\x01"), []byte("m1"))
	s.Put(KindInflight, []byte("\x02c1\x00\x02"), []byte("m2"))
	s.Put(KindInflight, []byte("\x03c10\x00\x01"), []byte("other client"))
	s.DeletePrefix(KindInflight, []byte("\x02c1"))
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("db Close: %v", err)
	}

	db, s = openSessionsForTest(t, dir)
	defer db.Close()
	defer s.Close()
	if got := collect(t, s, KindSysInfo); len(got) != 1 || got["c1"] != "v1b" {
		t.Errorf("clients after reopen = %v, want only c1=v1b", got)
	}
	if got := collect(t, s, KindInflight); len(got) != 1 || got["\x03c10\x00\x01"] != "other client" {
		t.Errorf("inflight after prefix delete = %q, want only the other client's record", got)
	}
}

func TestSessionStoreCloseCommitsQueuedWrites(t *testing.T) {
	dir := t.TempDir()
	db, s := openSessionsForTest(t, dir)
	for i := range 100 {
		s.Put(KindRetained, fmt.Appendf(nil, "t/%d", i), []byte("x"))
	}
	if err := s.Close(); err != nil { // no Sync: Close must commit what is queued
		t.Fatalf("Close: %v", err)
	}
	db.Close()
	db, s = openSessionsForTest(t, dir)
	defer db.Close()
	defer s.Close()
	if got := collect(t, s, KindRetained); len(got) != 100 {
		t.Fatalf("retained after reopen = %d records, want 100", len(got))
	}
}

func TestSessionStoreConcurrentWritersBatch(t *testing.T) {
	db, s := openSessionsForTest(t, t.TempDir())
	defer db.Close()
	defer s.Close()
	const writers, each = 16, 50
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				s.Put(KindKeyFilters, fmt.Appendf(nil, "%02d/%03d", w, i), []byte("q1"))
				if err := s.Sync(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Sync: %v", err)
	}
	if got := collect(t, s, KindKeyFilters); len(got) != writers*each {
		t.Fatalf("subscriptions = %d, want %d", len(got), writers*each)
	}
	if c := s.Commits(); c >= writers*each {
		t.Errorf("%d commits for %d synced writes: writers were not batched", c, writers*each)
	}
	t.Logf("%d synced writes from %d writers in %d commits", writers*each, writers, s.Commits())
}

func TestSessionStoreAfterClose(t *testing.T) {
	db, s := openSessionsForTest(t, t.TempDir())
	defer db.Close()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Sync(); err != ErrClosed {
		t.Fatalf("Sync after Close = %v, want ErrClosed", err)
	}
	s.Put(KindSysInfo, []byte("late"), []byte("x"))
	if s.WriteErrors() != 1 {
		t.Fatalf("WriteErrors = %d after a write past Close, want 1", s.WriteErrors())
	}
}

func TestSessionStoreUnknownKind(t *testing.T) {
	db, s := openSessionsForTest(t, t.TempDir())
	defer db.Close()
	defer s.Close()
	s.Put("bogus", []byte("k"), []byte("v"))
	if err := s.Sync(); err != nil || s.WriteErrors() != 1 {
		t.Fatalf("Sync = %v, write errors %d: want the bad write counted, the rest fine", err, s.WriteErrors())
	}
	if errs := s.Write(SessionWrite{Kind: "bogus", Key: []byte("k"), Val: []byte("v")}); !errors.Is(errs[0], ErrUnknownKind) {
		t.Fatalf("Write to an unknown kind = %v", errs[0])
	}
	if err := s.ForEach("bogus", func(_, _ []byte) error { return nil }); err == nil {
		t.Fatal("ForEach of an unknown kind succeeded")
	}
	// The store keeps working after a failed commit.
	s.Put(KindSysInfo, []byte("c"), []byte("v"))
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync after recovery: %v", err)
	}
}

// Deletes of what is not there change nothing, and a batch of nothing but
// them is rolled back instead of written: a clean-start client forgetting a
// session it never had costs the data file no commit.
func TestDeletesOfNothingCommitNothing(t *testing.T) {
	db, s := openSessionsForTest(t, t.TempDir())
	defer db.Close()
	defer s.Close()
	s.Put(KindInflight, []byte("\x02c1\x00\x01"), []byte("m1"))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	before := db.CommitStats()
	for i := range 100 {
		s.DeletePrefix(KindInflight, clientKeyForTest(fmt.Sprintf("never-%d", i)))
		s.Delete(KindSysInfo, []byte(fmt.Sprintf("never-%d", i)))
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	after := db.CommitStats()
	if after.Commits != before.Commits || after.Unchanged == before.Unchanged || after.FailedOps != 0 {
		t.Fatalf("before %+v, after %+v: deletes of nothing were committed", before, after)
	}
	// A batch with one real change commits, and the change is there.
	s.DeletePrefix(KindInflight, []byte("\x02c1"))
	s.DeletePrefix(KindKeyFilters, []byte("\x02c1"))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, s, KindInflight); len(got) != 0 {
		t.Fatalf("inflight after DeletePrefix: %v", got)
	}
	if st := db.CommitStats(); st.Commits != after.Commits+1 {
		t.Fatalf("stats %+v after %+v: the real delete was not committed once", st, after)
	}
}

func clientKeyForTest(id string) []byte { return append([]byte{byte(len(id))}, id...) }
