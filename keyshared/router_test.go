package keyshared

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// countDeliverer counts deliveries per member; refusing members refuse.
type countDeliverer struct {
	mu     sync.Mutex
	got    map[string]int
	refuse map[string]bool
}

func (d *countDeliverer) Deliver(member string, m *Message, attempt int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse[member] {
		return false
	}
	d.got[member]++
	return true
}

func (d *countDeliverer) Revoke(string, uint64) {}

func TestRouterRoutesDropsAndSkips(t *testing.T) {
	out := &countDeliverer{got: map[string]int{}, refuse: map[string]bool{"busy": true}}
	r := NewRouter(out)
	if _, ok := r.Route(&Message{Key: "k"}); ok {
		t.Fatal("routed with no member")
	}
	if err := r.AddMember("a", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.AddMember("eu", MemberOptions{KeyFilters: []string{"eu-*"}}); err != nil {
		t.Fatal(err)
	}
	if err := r.AddMember("busy", MemberOptions{KeyFilters: []string{"busy-*"}}); err != nil {
		t.Fatal(err)
	}
	if err := r.AddMember("x", MemberOptions{KeyFilters: []string{""}}); !errors.Is(err, ErrInvalidFilter) {
		t.Fatalf("bad filter: %v", err)
	}
	owner := map[string]string{}
	for i := range 1000 {
		key := fmt.Sprint("dev-", i%100)
		id, ok := r.Route(&Message{Key: key})
		if !ok || (owner[key] != "" && owner[key] != id) {
			t.Fatalf("key %s routed to %q (%v), before to %q", key, id, ok, owner[key])
		}
		owner[key] = id
	}
	if id, ok := r.Route(&Message{Key: "busy-1"}); ok || id == "" {
		t.Fatalf("refused message: %q %v", id, ok)
	}
	if err := r.RemoveMember("a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Route(&Message{Key: "dev-1"}); ok {
		t.Fatal("routed a key no member's filters match")
	}
	if err := r.RemoveMember("a"); !errors.Is(err, ErrUnknownMember) {
		t.Fatal(err)
	}
	s := r.Stats()
	if s.Delivered != 1000 || s.Dropped != 1 || s.Skipped != 2 || s.Members != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRouterConcurrentRouteAndMembership(t *testing.T) {
	out := &countDeliverer{got: map[string]int{}}
	r := NewRouter(out)
	if err := r.AddMember("base", MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				if _, ok := r.Route(&Message{Key: fmt.Sprint(g, "-", i)}); !ok {
					t.Error("not routed")
					return
				}
			}
		}()
	}
	for i := range 50 {
		if err := r.AddMember(fmt.Sprint("m", i), MemberOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if s := r.Stats(); s.Delivered != 8000 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRouterRouteDoesNotAllocate(t *testing.T) {
	r := NewRouter(&countDeliverer{got: map[string]int{}})
	for i := range 8 {
		if err := r.AddMember(fmt.Sprint("m", i), MemberOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	m := &Message{Key: "device-17"}
	if n := testing.AllocsPerRun(1000, func() { r.Route(m) }); n != 0 {
		t.Fatalf("Route allocates %.1f times", n)
	}
}
