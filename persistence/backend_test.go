package persistence

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/keyshared/backendtest"
)

// TestBackend runs the contract suite of keyshared.Backend against the
// local backend over every store of the store suite (the cluster's groups
// run the same suite in package cluster).
func TestBackend(t *testing.T) {
	for _, impl := range storeImpls {
		t.Run(impl.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) []keyshared.Backend {
				return []keyshared.Backend{keyshared.NewLocalBackend(impl.open(t).s)}
			})
		})
	}
}

// countingStore records the member counts a local backend reports.
type countingStore struct {
	keyshared.GroupStore
	mu   sync.Mutex
	last map[string]int
}

func (s *countingStore) MembersChanged(group string, n int, now time.Time) error {
	s.mu.Lock()
	s.last[group] = n
	s.mu.Unlock()
	return s.GroupStore.MembersChanged(group, n, now)
}

type nopOut struct{}

func (nopOut) Deliver(string, *keyshared.Message, int) bool { return false }
func (nopOut) Revoke(string, uint64)                        {}
func (nopOut) DeadLettered(keyshared.DeadLetter)            {}

// TestLocalMemberCountsArriveInOrder: members leaving at once report their
// group's count to the store in the order the counts were taken, so the
// last count recorded is the true one (once, a group stayed at one member
// for ever and was never idle).
func TestLocalMemberCountsArriveInOrder(t *testing.T) {
	mem := NewMemGroups()
	defer mem.Close()
	store := &countingStore{GroupStore: mem, last: map[string]int{}}
	b := keyshared.NewLocalBackend(store)
	const name = "s/g/#"
	if _, err := b.EnsureGroup(name, keyshared.GroupConfig{}); err != nil {
		t.Fatal(err)
	}
	g, err := b.Open(name, keyshared.DefaultConfig(), nopOut{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(t.Context())
	for round := range 100 {
		const members = 8
		for i := range members {
			if err := g.AddMember(fmt.Sprint("c", i), keyshared.MemberOptions{QoS: 1}); err != nil {
				t.Fatal(err)
			}
		}
		if got := len(g.Members()); got != members {
			t.Fatalf("round %d: %d members listed", round, got)
		}
		var wg sync.WaitGroup
		for i := range members {
			wg.Go(func() { _ = g.RemoveMember(fmt.Sprint("c", i)) })
		}
		wg.Wait()
		store.mu.Lock()
		last := store.last[name]
		store.mu.Unlock()
		if last != 0 {
			t.Fatalf("round %d: last count recorded %d, want 0", round, last)
		}
	}
}
