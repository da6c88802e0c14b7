// Package backendtest is the contract suite of keyshared.Backend (the
// contract is written in keyshared/backend.go): every implementation runs
// it, the local backend over the bbolt and in-memory stores (package
// persistence) and the cluster's groups over a real NATS cluster (package
// cluster). A backend that passes it can sit under the broker's hooks.
package backendtest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/keyshared"
)

// Timeout bounds every wait of the suite for something a backend does in
// the background (a delivery, a dead letter): a cluster elects a holder
// for each group first, which takes a few seconds on a loaded machine.
const Timeout = 30 * time.Second

// New returns, for one subtest, the backends of every node of one new,
// empty deployment (one for a single node; a cluster's nodes), having
// registered their cleanup with t. The suite drives the first; the others
// open the groups too, as their brokers would, so that what happens on the
// node dispatching a group (dead letters handed out) is seen wherever that is.
type New func(t *testing.T) []keyshared.Backend

// Run runs the contract against the deployments new returns, one per subtest.
func Run(t *testing.T, new New) {
	t.Run("Groups", func(t *testing.T) { testGroups(t, new(t)[0]) })
	t.Run("Append", func(t *testing.T) { testAppend(t, new(t)[0]) })
	t.Run("Backlog", func(t *testing.T) { testBacklog(t, new(t)[0]) })
	t.Run("Committed", func(t *testing.T) { testCommitted(t, new(t)[0]) })
	t.Run("Dispatch", func(t *testing.T) { testDispatch(t, new(t)[0]) })
	t.Run("DeadLetters", func(t *testing.T) { testDeadLetters(t, new(t)) })
}

func ensure(t *testing.T, b keyshared.Backend, name string, cfg keyshared.GroupConfig) {
	t.Helper()
	if _, err := b.EnsureGroup(name, cfg); err != nil {
		t.Fatalf("EnsureGroup %s: %v", name, err)
	}
}

func msg(key string, i int) keyshared.Message {
	return keyshared.Message{Key: key, Topic: "t/" + key, QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", key, i), PublishedAt: time.Now()}
}

// testGroups: names, existence, config updates, listing, deletion.
func testGroups(t *testing.T, b keyshared.Backend) {
	for _, bad := range []string{"", "nofilter", "/x", "s/"} {
		if _, err := b.EnsureGroup(bad, keyshared.GroupConfig{}); !errors.Is(err, keyshared.ErrBadGroupName) {
			t.Errorf("EnsureGroup(%q): %v, want ErrBadGroupName", bad, err)
		}
	}
	if _, err := b.EnsureGroup("s/a/#", keyshared.GroupConfig{Policy: 9}); !errors.Is(err, keyshared.ErrBadConfig) {
		t.Errorf("EnsureGroup with policy 9: %v, want ErrBadConfig", err)
	}
	if _, err := b.Group("s/none"); !errors.Is(err, keyshared.ErrGroupNotFound) {
		t.Errorf("Group of an unknown group: %v, want ErrGroupNotFound", err)
	}
	created, err := b.EnsureGroup("s/b/+", keyshared.GroupConfig{})
	if err != nil || !created {
		t.Fatalf("EnsureGroup s/b/+: created=%v err=%v, want a new group", created, err)
	}
	if created, err = b.EnsureGroup("s/b/+", keyshared.GroupConfig{}); err != nil || created {
		t.Fatalf("EnsureGroup s/b/+ again: created=%v err=%v, want the existing group", created, err)
	}
	cfg := keyshared.GroupConfig{MaxMessages: 10, Policy: keyshared.PolicyDropOldest}
	if created, err = b.EnsureGroup("s/b/+", cfg); err != nil || created {
		t.Fatalf("EnsureGroup s/b/+ with a new config: created=%v err=%v", created, err)
	}
	ensure(t, b, "s/a/#", keyshared.GroupConfig{})
	gi, err := b.Group("s/b/+")
	if err != nil {
		t.Fatal(err)
	}
	if gi.Name != "s/b/+" || gi.Share != "s" || gi.Filter != "b/+" || gi.Config != cfg || gi.Head != 0 || gi.Backlog != 0 {
		t.Errorf("Group s/b/+: %+v", gi)
	}
	all, err := b.Groups()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range all {
		names = append(names, g.Name)
	}
	if !slices.Equal(names, []string{"s/a/#", "s/b/+"}) {
		t.Errorf("Groups: %q, want [s/a/# s/b/+] in order", names)
	}
	if err := b.DeleteGroup("s/a/#"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Group("s/a/#"); !errors.Is(err, keyshared.ErrGroupNotFound) {
		t.Errorf("Group after DeleteGroup: %v, want ErrGroupNotFound", err)
	}
	if err := b.DeleteGroup("s/a/#"); !errors.Is(err, keyshared.ErrGroupNotFound) {
		t.Errorf("DeleteGroup twice: %v, want ErrGroupNotFound", err)
	}
	rs := keyshared.AppendMulti(b, []string{"s/a/#"}, msg("k", 0))
	if len(rs) != 1 || !errors.Is(rs[0].Err, keyshared.ErrGroupNotFound) {
		t.Errorf("append to a deleted group: %+v, want ErrGroupNotFound", rs)
	}
}

// testAppend: one result per group in the order given, offsets from 1 that
// only grow, a refusal does not stop the others, one key's appends complete
// in the order made, and Pending lists what is unresolved.
// testCommitted: a backend that says it tells the end of its commits
// (OnCommitted true) calls fn after the done call of every append, on the
// goroutine that ran it; one that says it does not never calls fn.
func testCommitted(t *testing.T, b keyshared.Backend) {
	ensure(t, b, "s/c/#", keyshared.GroupConfig{})
	var mu sync.Mutex
	undone := 0 // done calls not followed by fn yet
	calls := 0
	tells := b.OnCommitted(func() {
		mu.Lock()
		undone = 0
		calls++
		mu.Unlock()
	})
	const n = 50
	all := make(chan struct{})
	var left sync.WaitGroup
	left.Add(n)
	for i := range n {
		b.AppendMultiAsync([]string{"s/c/#"}, msg("k", i), func(rs []keyshared.AppendResult) {
			if rs[0].Err != nil {
				t.Errorf("append %d: %v", i, rs[0].Err)
			}
			mu.Lock()
			undone++
			mu.Unlock()
			left.Done()
		})
	}
	go func() { left.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(Timeout):
		t.Fatal("appends not done")
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if !tells {
		mu.Lock()
		defer mu.Unlock()
		if calls != 0 {
			t.Fatalf("OnCommitted reported false, yet fn ran %d times", calls)
		}
		return
	}
	mqtttest.Eventually(t, Timeout, "fn after the last done call", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return undone == 0 && calls > 0
	})
}

func testAppend(t *testing.T, b keyshared.Backend) {
	ensure(t, b, "s/x/#", keyshared.GroupConfig{})
	ensure(t, b, "s/y/#", keyshared.GroupConfig{})
	groups := []string{"s/x/#", "s/none/#", "s/y/#"}
	rs := keyshared.AppendMulti(b, groups, msg("k", 0))
	if len(rs) != 3 {
		t.Fatalf("%d results for 3 groups", len(rs))
	}
	for i, r := range rs {
		if r.Group != groups[i] {
			t.Errorf("result %d is of %q, want %q", i, r.Group, groups[i])
		}
	}
	if rs[0].Err != nil || rs[0].Offset != 1 || rs[2].Err != nil || rs[2].Offset != 1 {
		t.Errorf("first appends: %+v, want offset 1 in s/x/# and s/y/#", rs)
	}
	if !errors.Is(rs[1].Err, keyshared.ErrGroupNotFound) {
		t.Errorf("append to an unknown group: %v, want ErrGroupNotFound", rs[1].Err)
	}

	// One key, many appends in flight: they complete in the order made.
	const n = 200
	var mu sync.Mutex
	var order []int
	var offsets []uint64
	var wg sync.WaitGroup
	calls := make([]int, n)
	for i := range n {
		wg.Add(1)
		b.AppendMultiAsync([]string{"s/x/#"}, msg("one", i+1), func(rs []keyshared.AppendResult) {
			mu.Lock()
			calls[i]++
			order = append(order, i)
			if rs[0].Err != nil {
				t.Errorf("append %d: %v", i, rs[0].Err)
			}
			offsets = append(offsets, rs[0].Offset)
			mu.Unlock()
			wg.Done()
		})
	}
	wg.Wait()
	for i, c := range calls {
		if c != 1 {
			t.Fatalf("done of append %d called %d times", i, c)
		}
	}
	for i := 1; i < n; i++ {
		if order[i] < order[i-1] || offsets[i] <= offsets[i-1] {
			t.Fatalf("one key's appends completed out of order: #%d (offset %d) after #%d (offset %d)", order[i], offsets[i], order[i-1], offsets[i-1])
		}
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	gi, err := b.Group("s/x/#")
	if err != nil {
		t.Fatal(err)
	}
	if gi.Head != n+1 || gi.Backlog != n+1 {
		t.Errorf("after %d appends: head %d backlog %d", n+1, gi.Head, gi.Backlog)
	}
	pending, err := b.Pending("s/x/#", 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 5 {
		t.Fatalf("Pending: %d messages, want 5", len(pending))
	}
	for i, m := range pending {
		if m.Offset != uint64(i+1) {
			t.Errorf("Pending[%d] at offset %d", i, m.Offset)
		}
	}
	if string(pending[0].Payload) != "k:0" || pending[0].Key != "k" || pending[0].Topic != "t/k" {
		t.Errorf("Pending[0] = %q key %q topic %q", pending[0].Payload, pending[0].Key, pending[0].Topic)
	}
}

// testBacklog: the reject policy refuses past a limit, and a message above
// MaxBytes is refused under either policy; drop-oldest makes room.
func testBacklog(t *testing.T, b keyshared.Backend) {
	ensure(t, b, "s/r/#", keyshared.GroupConfig{MaxMessages: 3, Policy: keyshared.PolicyReject})
	for i := range 3 {
		if r := keyshared.AppendMulti(b, []string{"s/r/#"}, msg("k", i))[0]; r.Err != nil {
			t.Fatalf("append %d under the limit: %v", i, r.Err)
		}
	}
	if r := keyshared.AppendMulti(b, []string{"s/r/#"}, msg("k", 3))[0]; !errors.Is(r.Err, keyshared.ErrBacklogFull) {
		t.Errorf("append past MaxMessages under reject: %+v, want ErrBacklogFull", r)
	}
	ensure(t, b, "s/big/#", keyshared.GroupConfig{MaxBytes: 512, Policy: keyshared.PolicyDropOldest})
	big := msg("k", 0)
	big.Payload = make([]byte, 1024)
	if r := keyshared.AppendMulti(b, []string{"s/big/#"}, big)[0]; !errors.Is(r.Err, keyshared.ErrBacklogFull) {
		t.Errorf("a message above MaxBytes under drop-oldest: %+v, want ErrBacklogFull", r)
	}
	ensure(t, b, "s/d/#", keyshared.GroupConfig{MaxMessages: 3, Policy: keyshared.PolicyDropOldest})
	for i := range 5 {
		if r := keyshared.AppendMulti(b, []string{"s/d/#"}, msg("k", i))[0]; r.Err != nil {
			t.Fatalf("append %d under drop-oldest: %v", i, r.Err)
		}
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	pending, err := b.Pending("s/d/#", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range pending {
		got = append(got, string(m.Payload))
	}
	if !slices.Equal(got, []string{"k:2", "k:3", "k:4"}) {
		t.Errorf("after 5 appends to a drop-oldest group of 3: pending %q, want the newest 3", got)
	}
}

// recorder is a node's Output: it records deliveries and dead letters.
type recorder struct {
	mu    sync.Mutex
	got   []delivery
	dead  []keyshared.DeadLetter
	event chan struct{}
}

type delivery struct {
	member  string
	offset  uint64
	key     string
	payload string
	attempt int
}

func newRecorder() *recorder { return &recorder{event: make(chan struct{}, 1)} }

func (r *recorder) Deliver(member string, m *keyshared.Message, attempt int) bool {
	r.mu.Lock()
	r.got = append(r.got, delivery{member, m.Offset, m.Key, string(m.Payload), attempt})
	r.mu.Unlock()
	r.kick()
	return true
}

func (r *recorder) Revoke(string, uint64) {}

func (r *recorder) DeadLettered(d keyshared.DeadLetter) {
	r.mu.Lock()
	r.dead = append(r.dead, d)
	r.mu.Unlock()
	r.kick()
}

func (r *recorder) kick() {
	select {
	case r.event <- struct{}{}:
	default:
	}
}

// wait returns once cond holds (called with r.mu held), failing the test
// after Timeout. It looks again on every delivery or dead letter, and on a
// ticker for what a backend does without telling the recorder.
func (r *recorder) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.event:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", Timeout, what)
		}
	}
}

func open(t *testing.T, b keyshared.Backend, name string, out keyshared.Output) keyshared.Group {
	t.Helper()
	cfg := keyshared.DefaultConfig()
	cfg.RetryBackoffBase, cfg.RetryBackoffMax = 0, 0
	cfg.MaxDeliveries = 3
	g, err := b.Open(name, cfg, out)
	if err != nil {
		t.Fatalf("Open %s: %v", name, err)
	}
	t.Cleanup(func() { _ = g.Close(t.Context()) })
	return g
}

// openWhenKnown opens group name on another node of the deployment once
// that node knows the group (a cluster's nodes learn of groups from a watch).
func openWhenKnown(t *testing.T, b keyshared.Backend, name string, out keyshared.Output) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		g, err := b.Open(name, keyshared.DefaultConfig(), out)
		if err == nil {
			t.Cleanup(func() { _ = g.Close(t.Context()) })
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Open %s on another node: %v", name, err)
		}
		<-tick.C
	}
}

// testDispatch: per key one message in flight, in log order; an ack
// resolves, a nack retries; members are listed.
func testDispatch(t *testing.T, b keyshared.Backend) {
	const name = "s/orders/#"
	ensure(t, b, name, keyshared.GroupConfig{})
	const keys, perKey = 4, 5
	for i := range perKey {
		for k := range keys {
			if r := keyshared.AppendMulti(b, []string{name}, msg(fmt.Sprint("k", k), i))[0]; r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	out := newRecorder()
	g := open(t, b, name, out)
	if err := g.AddMember("m1", keyshared.MemberOptions{QoS: 1}); err != nil {
		t.Fatal(err)
	}
	g.Notify()
	// Without acks, one message per key is in flight: the first of each.
	out.wait(t, "the first message of every key", func() bool { return len(out.got) >= keys })
	out.mu.Lock()
	first := slices.Clone(out.got)
	out.mu.Unlock()
	for _, d := range first[:keys] {
		if d.payload != d.key+":0" || d.member != "m1" || d.attempt != 1 {
			t.Errorf("first delivery of %s: %+v, want %s:0 to m1 at attempt 1", d.key, d, d.key)
		}
	}
	if ms := g.Members(); len(ms) != 1 || ms[0].ID != "m1" || ms[0].QoS != 1 {
		t.Errorf("Members: %+v, want m1 at QoS 1", ms)
	}
	// A nack of k0's first message: it comes again, before k0's second.
	var nacked delivery
	for _, d := range first {
		if d.key == "k0" {
			nacked = d
		}
	}
	if err := g.Nack("m1", nacked.offset, 0x80); err != nil {
		t.Fatal(err)
	}
	out.wait(t, "the nacked message again", func() bool {
		for _, d := range out.got {
			if d.offset == nacked.offset && d.attempt == 2 {
				return true
			}
		}
		return false
	})
	// Ack everything as it comes (outside the recorder's lock: an ack may
	// lead to a delivery at once): every key's messages arrive in order.
	acked := map[uint64]bool{}
	seen := 0
	deadline := time.Now().Add(Timeout)
	for len(acked) < keys*perKey {
		out.mu.Lock()
		fresh := slices.Clone(out.got[seen:])
		seen = len(out.got)
		out.mu.Unlock()
		for _, d := range fresh {
			if !acked[d.offset] {
				acked[d.offset] = true
				if err := g.Ack(d.member, d.offset); err != nil {
					t.Errorf("ack %d: %v", d.offset, err)
				}
			}
		}
		if len(fresh) > 0 {
			continue
		}
		select {
		case <-out.event:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("timed out after %v with %d of %d messages acknowledged", Timeout, len(acked), keys*perKey)
		}
	}
	out.mu.Lock()
	perKeyGot := map[string][]string{}
	for _, d := range out.got {
		if l := perKeyGot[d.key]; len(l) == 0 || l[len(l)-1] != d.payload {
			perKeyGot[d.key] = append(l, d.payload)
		}
	}
	out.mu.Unlock()
	for k := range keys {
		key := fmt.Sprint("k", k)
		var want []string
		for i := range perKey {
			want = append(want, fmt.Sprintf("%s:%d", key, i))
		}
		if !slices.Equal(perKeyGot[key], want) {
			t.Errorf("key %s delivered %q, want %q", key, perKeyGot[key], want)
		}
	}
	// What is acknowledged is resolved: nothing is pending.
	out.wait(t, "no message pending", func() bool {
		p, err := b.Pending(name, 0, 10)
		return err == nil && len(p) == 0
	})
}

// testDeadLetters: a reject dead-letters a message (the Output of the node
// dispatching the group is told once, after it is stored; DeadLetters
// lists it on any node); a replay puts it back at the tail in one step;
// delete and purge.
func testDeadLetters(t *testing.T, nodes []keyshared.Backend) {
	const name = "s/dl/#"
	b := nodes[0]
	ensure(t, b, name, keyshared.GroupConfig{})
	out := newRecorder()
	g := open(t, b, name, out)
	for _, other := range nodes[1:] {
		openWhenKnown(t, other, name, out)
	}
	if err := g.AddMember("m1", keyshared.MemberOptions{QoS: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if r := keyshared.AppendMulti(b, []string{name}, msg(fmt.Sprint("d", i), i))[0]; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	g.Notify()
	out.wait(t, "three deliveries", func() bool { return len(out.got) >= 3 })
	out.mu.Lock()
	got := slices.Clone(out.got[:3])
	out.mu.Unlock()
	for _, d := range got {
		if err := g.Reject("m1", d.offset, 0x87); err != nil {
			t.Fatal(err)
		}
	}
	out.wait(t, "three dead letters handed out", func() bool { return len(out.dead) >= 3 })
	var dls []keyshared.DeadLetterEntry
	out.wait(t, "three dead letters listed", func() bool {
		var err error
		dls, err = b.DeadLetters(name, 0, 10)
		return err == nil && len(dls) == 3
	})
	for i := 1; i < len(dls); i++ {
		if dls[i].ID <= dls[i-1].ID {
			t.Errorf("dead letter ids not growing: %d after %d", dls[i].ID, dls[i-1].ID)
		}
	}
	if dls[0].Reason != 0x87 || dls[0].Group != name {
		t.Errorf("dead letter: reason %#x group %q, want 0x87 %s", dls[0].Reason, dls[0].Group, name)
	}
	if page, err := b.DeadLetters(name, dls[0].ID, 10); err != nil || len(page) != 2 || page[0].ID != dls[1].ID {
		t.Errorf("DeadLetters after the first id: %d entries, %v", len(page), err)
	}
	one, err := b.DeadLetter(name, dls[1].ID)
	if err != nil || string(one.Message.Payload) != string(dls[1].Message.Payload) {
		t.Errorf("DeadLetter %d: %q, %v", dls[1].ID, one.Message.Payload, err)
	}
	off, err := b.ReplayDeadLetter(name, dls[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if off <= got[2].offset {
		t.Errorf("replayed at offset %d, want past the tail %d", off, got[2].offset)
	}
	if _, err := b.DeadLetter(name, dls[0].ID); !errors.Is(err, keyshared.ErrDeadLetterNotFound) {
		t.Errorf("the replayed dead letter is still there: %v", err)
	}
	g.Notify()
	out.wait(t, "the replayed message delivered", func() bool {
		for _, d := range out.got {
			if d.offset == off && d.payload == string(dls[0].Message.Payload) {
				return true
			}
		}
		return false
	})
	if err := g.Ack("m1", off); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteDeadLetter(name, dls[1].ID); err != nil {
		t.Fatal(err)
	}
	if n, err := b.PurgeDeadLetters(name); err != nil || n != 1 {
		t.Errorf("PurgeDeadLetters: %d, %v; want the 1 left", n, err)
	}
	if left, err := b.DeadLetters(name, 0, 10); err != nil || len(left) != 0 {
		t.Errorf("after the purge: %d dead letters, %v", len(left), err)
	}
	out.mu.Lock()
	if len(out.dead) != 3 {
		t.Errorf("%d dead letters handed out for 3 rejects", len(out.dead))
	}
	out.mu.Unlock()
}
