package hooks

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"unsafe"

	"github.com/keyline-mq/keyline/internal/share"
)

func testGroup(name string) *ksGroup {
	n, err := share.Parse(name)
	if err != nil {
		panic(err)
	}
	return &ksGroup{name: name, n: n}
}

func TestRegistryMatchesAndCachesCopies(t *testing.T) {
	r := newGroupRegistry()
	for _, name := range []string{"w/orders/#", "w/orders/+/eu", "x/other"} {
		if _, err := r.ensure(name, func() (*ksGroup, error) { return testGroup(name), nil }); err != nil {
			t.Fatal(err)
		}
	}
	names := func(gs []*ksGroup) []string {
		var out []string
		for _, g := range gs {
			out = append(out, g.name)
		}
		return out
	}
	// A topic that is a view into a large buffer: the cache must keep a copy.
	packet := []byte("orders/1/eu" + strings.Repeat("x", 1<<20))
	topic := string(packet[:len("orders/1/eu")])
	if got := names(r.match(topic)); !slices.Equal(got, []string{"w/orders/#", "w/orders/+/eu"}) {
		t.Fatalf("match = %v", got)
	}
	r.matches.m.Range(func(k, _ any) bool {
		if unsafe.StringData(k.(string)) == &packet[0] {
			t.Errorf("cache key %q is a view into the packet", k)
		}
		return true
	})
	if b := r.matches.bytes.Load(); b <= 0 || b > 1<<10 {
		t.Fatalf("cache accounts %d bytes for one small topic", b)
	}
	if g := r.remove("w/orders/#"); g == nil {
		t.Fatal("remove found nothing")
	}
	if got := names(r.match("orders/1/eu")); !slices.Equal(got, []string{"w/orders/+/eu"}) {
		t.Fatalf("match after remove = %v (stale cache)", got)
	}
}

// TestRegistryEnsureOpensOnce: callers that ask for a group while it is
// being opened wait for that open instead of opening it again. In a synctest
// bubble, the test looks once every caller is blocked: the first in open,
// the others waiting for it; without the registry's opening set all eight
// are in open, every time.
func TestRegistryEnsureOpensOnce(t *testing.T) {
	synctest.Test(t, testRegistryEnsureOpensOnce)
}

func testRegistryEnsureOpensOnce(t *testing.T) {
	r := newGroupRegistry()
	release := make(chan struct{})
	var calls atomic.Int32
	open := func() (*ksGroup, error) {
		calls.Add(1)
		<-release
		return testGroup("w/a"), nil
	}
	got := make([]*ksGroup, 8)
	errs := make([]error, len(got))
	var opened sync.WaitGroup
	for i := range got {
		opened.Go(func() { got[i], errs[i] = r.ensure("w/a", open) })
	}
	synctest.Wait() // every caller is inside ensure, blocked
	atOnce := calls.Load()
	close(release)
	opened.Wait()
	if atOnce != 1 || calls.Load() != 1 {
		t.Fatalf("%d callers were opening the group at once, %d opened it in all", atOnce, calls.Load())
	}
	for i, g := range got {
		if errs[i] != nil || g != got[0] {
			t.Fatalf("caller %d: %p %v, the first got %p", i, g, errs[i], got[0])
		}
	}
	// A failed open lets the next caller try again.
	boom := errors.New("boom")
	if _, err := r.ensure("w/b", func() (*ksGroup, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if g, err := r.ensure("w/b", func() (*ksGroup, error) { return testGroup("w/b"), nil }); err != nil || g == nil {
		t.Fatal(err)
	}
	if r.count() != 2 {
		t.Fatalf("count %d", r.count())
	}
}

func TestTopicCacheIsBounded(t *testing.T) {
	c := newTopicCache[int](10, 1<<20)
	for i := range 25 {
		c.put(fmt.Sprint("t/", i), 1, i, 0)
	}
	if n := c.entries.Load(); n > 10 {
		t.Fatalf("%d entries, bound 10", n)
	}
	c = newTopicCache[int](1000, 4096)
	for i := range 100 {
		c.put(fmt.Sprint("t/", i, strings.Repeat("x", 200)), 1, i, 0)
	}
	if b := c.bytes.Load(); b > 4096 {
		t.Fatalf("%d bytes, bound 4096", b)
	}
	c.put(strings.Repeat("y", 5000), 1, 0, 0) // larger than the bound alone: not cached
	if _, ok := c.get(strings.Repeat("y", 5000), 1); ok {
		t.Fatal("an entry larger than the bound was cached")
	}
	c.put("a", 1, 7, 0)
	if v, ok := c.get("a", 1); !ok || v != 7 {
		t.Fatal("fresh entry missing")
	}
	if _, ok := c.get("a", 2); ok {
		t.Fatal("stale version returned")
	}
	before := c.entries.Load()
	c.put("a", 2, 8, 0)
	if c.entries.Load() != before {
		t.Fatalf("replacing an entry changed the count: %d -> %d", before, c.entries.Load())
	}
}

// TestTopicCacheSweepsStaleEntries: entries of topics nobody asks for again
// go once the index has changed and the cache has grown: what they hold
// (sessions, groups) does not stay until the bound is reached.
func TestTopicCacheSweepsStaleEntries(t *testing.T) {
	c := newTopicCache[*int](1<<20, 1<<30)
	version := uint64(0)
	for i := range 100 * sweepSlack {
		if i%10 == 0 {
			version++ // the index changes while topics come and go
		}
		c.put(fmt.Sprint("t/", i), version, new(int), 0)
	}
	if n := c.entries.Load(); n > 3*sweepSlack {
		t.Fatalf("%d entries after %d topics used once; stale ones were not swept", n, 100*sweepSlack)
	}
	if _, ok := c.get(fmt.Sprint("t/", 100*sweepSlack-1), version); !ok {
		t.Fatal("the freshest entry was swept")
	}
	var n, bytes int64
	c.m.Range(func(_, e any) bool { n++; bytes += e.(*cached[*int]).cost; return true })
	if n != c.entries.Load() || bytes != c.bytes.Load() {
		t.Fatalf("counts %d entries %d bytes, map holds %d and %d", c.entries.Load(), c.bytes.Load(), n, bytes)
	}
}

func TestMembershipsCountBothWays(t *testing.T) {
	ms := newMemberships()
	if n := ms.set("c1", "g/a", &membership{qos: 1}); n != 1 {
		t.Fatal(n)
	}
	if n := ms.set("c2", "g/a", &membership{qos: 1}); n != 2 {
		t.Fatal(n)
	}
	ms.set("c1", "g/b", &membership{qos: 2, keyFilters: []string{"k*"}})
	if got := ms.ids("g/a"); !slices.Equal(got, []string{"c1", "c2"}) {
		t.Fatal(got)
	}
	if m := ms.get("c1", "g/b"); m == nil || m.qos != 2 {
		t.Fatal(m)
	}
	if n, was := ms.remove("c1", "g/a"); n != 1 || !was {
		t.Fatal(n, was)
	}
	if n, was := ms.remove("c1", "g/a"); n != 1 || was {
		t.Fatal("second remove:", n, was)
	}
	if of := ms.of("c1"); len(of) != 1 || of["g/b"] == nil {
		t.Fatal(of)
	}
	ms.remove("c2", "g/a")
	if ms.count("g/a") != 0 || len(ms.byGroup) != 1 {
		t.Fatalf("empty group kept: %v", ms.byGroup)
	}
}

func TestInflightTableBothWays(t *testing.T) {
	it := newInflightTable()
	g := testGroup("w/a")
	it.track("c", 7, g, 42)
	if !it.owns("c", 7) || it.owns("c", 8) || it.owns("d", 7) {
		t.Fatal("owns")
	}
	if id, ok := it.revoke("w/a", "c", 42); !ok || id != 7 {
		t.Fatal(id, ok)
	}
	if it.owns("c", 7) {
		t.Fatal("revoked delivery still owned")
	}
	it.track("c", 9, g, 43)
	if d, ok := it.untrack("c", 9); !ok || d.offset != 43 || d.group != g {
		t.Fatal(d, ok)
	}
	if _, ok := it.revoke("w/a", "c", 43); ok {
		t.Fatal("untracked delivery revoked")
	}
	// Two groups deliver to one member: a revoke names its group.
	h := testGroup("w/b")
	it.track("c", 1, g, 50)
	it.track("c", 2, h, 50)
	if id, ok := it.revoke("w/b", "c", 50); !ok || id != 2 || !it.owns("c", 1) {
		t.Fatal("revoke took the other group's delivery", id, ok)
	}
	it.untrack("c", 1)
	if n := it.clientCount(); n != 0 {
		t.Fatalf("%d clients left in the table with nothing in flight", n)
	}
}

func TestDLQTopicFitsMQTT(t *testing.T) {
	if got := dlqTopic("billing", "orders/eu/1"); got != "$dlq/billing/orders/eu/1" {
		t.Fatal(got)
	}
	if got := dlqTopic("billing", "/lead"); got != "$dlq/billing/lead" {
		t.Fatal(got)
	}
	long := strings.Repeat("t", 65530)
	if got := dlqTopic(strings.Repeat("s", 256), long); got != "$dlq/"+strings.Repeat("s", 256) {
		t.Fatalf("a topic past 65,535 bytes under the prefix: %d bytes", len(got))
	}
}

// clientCount returns how many clients have deliveries tracked (tests).
func (t *inflightTable) clientCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.clients)
}
