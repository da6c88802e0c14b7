package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/keyshared"
)

// keyLog records the deliveries of every node's members, per key, in the
// order they happened: a key moves between members (and nodes) when members
// join, so per-member lists cannot tell its order.
type keyLog struct {
	mu  sync.Mutex
	got map[string][]int // key -> seqs in delivery order
}

// fakeMembers is a node's members: each delivery is recorded and acked
// from another goroutine, as a client's PUBACK arrives.
type fakeMembers struct {
	t     *testing.T
	grp   func() keyshared.Group
	acks  chan delivery
	log   *keyLog
	mu    sync.Mutex
	total int
	wg    sync.WaitGroup
	stop  chan struct{}
}

func newFakeMembers(t *testing.T, log *keyLog) *fakeMembers {
	f := &fakeMembers{t: t, acks: make(chan delivery, 1<<16), log: log, stop: make(chan struct{})}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			select {
			case d := <-f.acks:
				_ = f.grp().Ack(d.member, d.offset)
			case <-f.stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(f.stop); f.wg.Wait() })
	return f
}

func (f *fakeMembers) Deliver(member string, m *keyshared.Message, _ int) bool {
	key, seq, _ := strings.Cut(string(m.Payload), ":")
	n, _ := strconv.Atoi(seq)
	f.log.mu.Lock()
	f.log.got[key] = append(f.log.got[key], n)
	f.log.mu.Unlock()
	f.mu.Lock()
	f.total++
	f.mu.Unlock()
	f.acks <- delivery{member, m.Offset}
	return true
}

func (f *fakeMembers) Revoke(string, uint64) {}

func (f *fakeMembers) DeadLettered(keyshared.DeadLetter) {}

func startGroupsNode(t *testing.T, urls []string, id string) (*Node, *Groups) {
	t.Helper()
	n, _ := startNode(t, urls, id)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", id)
	g, err := n.StartGroups(ctx, GroupsConfig{Logger: logger, LeaseTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return n, g
}

func TestGroupsAcrossNodes(t *testing.T) {
	nc := natstest.Start(t, 3)
	urls := nc.URLs()
	const name = "billing/orders/#"
	var gs []*Groups
	var fms []*fakeMembers
	var grps []keyshared.Group
	log := &keyLog{got: map[string][]int{}}
	for i := range 3 {
		_, g := startGroupsNode(t, urls[i:i+1], fmt.Sprintf("node-%c", 'a'+i))
		gs = append(gs, g)
	}
	if _, err := gs[0].EnsureGroup(name, keyshared.GroupConfig{}); err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		fm := newFakeMembers(t, log)
		eventually(t, 10*time.Second, "the group to be known", func() bool { _, err := g.known(name); return err == nil })
		grp, err := g.Open(name, keyshared.Config{}, fm)
		if err != nil {
			t.Fatal(err)
		}
		fm.grp = func() keyshared.Group { return grp }
		fms, grps = append(fms, fm), append(grps, grp)
		if err := grp.AddMember(fmt.Sprintf("m-%d", i), keyshared.MemberOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 15*time.Second, "a holder", func() bool { _, ok := grps[0].Holder(); return ok })
	const keys, perKey = 50, 20
	for s := range perKey {
		var wg sync.WaitGroup
		for k := range keys {
			wg.Add(1)
			key := fmt.Sprintf("k%03d", k)
			m := keyshared.Message{Key: key, Topic: "orders/x", QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", key, s), PublishedAt: time.Now()}
			gs[k%3].AppendMultiAsync([]string{name}, m, func(rs []keyshared.AppendResult) {
				if rs[0].Err != nil {
					t.Error(rs[0].Err)
				}
				wg.Done()
			})
		}
		wg.Wait()
	}
	eventually(t, 30*time.Second, "every message delivered", func() bool {
		n := 0
		for _, fm := range fms {
			fm.mu.Lock()
			n += fm.total
			fm.mu.Unlock()
		}
		return n >= keys*perKey
	})
	per := map[string][]int{}
	log.mu.Lock()
	for k, s := range log.got {
		per[k] = append([]int(nil), s...)
	}
	log.mu.Unlock()
	for k := range keys {
		key := fmt.Sprintf("k%03d", k)
		s := per[key]
		if len(s) != perKey {
			t.Fatalf("key %s: %d deliveries: %v", key, len(s), s)
		}
		for i, v := range s {
			if v != i {
				t.Fatalf("key %s out of order: %v", key, s)
			}
		}
	}
	eventually(t, 10*time.Second, "the cursor to reach the head", func() bool {
		gi, err := gs[1].Group(name)
		return err == nil && gi.Cursor == gi.Head && gi.Head == keys*perKey
	})
	st := grps[2].Stats()
	if st.Members != 3 || st.Acked != keys*perKey {
		t.Fatalf("stats from another node: %+v", st)
	}
}

// TestMemberJoiningDuringAResyncIsKept: a member that joins while its node
// resyncs with the holder is a member afterwards. The resync's snapshot of
// the node's members was sent after the members' lock was let go, so a join
// made in between could reach the holder first, and the holder then dropped
// the member as "left" when the older snapshot came (CI:
// TestClusterSharedSubscriptionFollowsSession, "both members not active").
func TestMemberJoiningDuringAResyncIsKept(t *testing.T) {
	nc := natstest.Start(t, 1)
	_, g := startGroupsNode(t, nc.URLs(), "node-a")
	const name = "resync/race/#"
	if _, err := g.EnsureGroup(name, keyshared.GroupConfig{}); err != nil {
		t.Fatal(err)
	}
	grp, err := g.Open(name, keyshared.Config{}, newFakeMembers(t, &keyLog{got: map[string][]int{}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := grp.AddMember("m-1", keyshared.MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "a holder with m-1", func() bool {
		_, ok := grp.Holder()
		return ok && grp.Stats().Members == 1
	})
	ng := grp.(*Group).ng
	var once sync.Once
	hook := func(got *nodeGroup) {
		if got != ng {
			return
		}
		once.Do(func() {
			if err := grp.AddMember("m-2", keyshared.MemberOptions{}); err != nil {
				t.Error(err)
			}
		})
	}
	testHookResyncQueued.Store(&hook)
	t.Cleanup(func() { testHookResyncQueued.Store(nil) })
	ng.mu.Lock()
	holder, epoch := ng.mu.holder, ng.mu.epoch
	ng.mu.Unlock()
	ng.switchHolder(holder, epoch, true) // a resync, as a restarted local holder gets
	eventually(t, 10*time.Second, "m-1 and m-2 members", func() bool { return grp.Stats().Members == 2 })
}

// TestGroupsEnsuredTogether: nodes on different NATS servers open the same
// groups at the same moment (members of eight groups subscribing on three
// nodes at once); every one of them succeeds, exactly one node creates each
// group. A node whose create lost the race reads the winner's meta, and that
// read may be answered by a replica that has not applied the create yet.
func TestGroupsEnsuredTogether(t *testing.T) {
	nc := natstest.Start(t, 3)
	var gs []*Groups
	for i, u := range nc.URLs() {
		_, g := startGroupsNode(t, []string{u}, fmt.Sprintf("node-%d", i))
		gs = append(gs, g)
	}
	const groups = 24
	var created [groups]atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, g := range gs {
		for i := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				c, err := g.EnsureGroup(fmt.Sprintf("g%d/together/%d/#", i, i), keyshared.GroupConfig{})
				if err != nil {
					t.Errorf("group %d: %v", i, err)
				}
				if c {
					created[i].Add(1)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	for i := range groups {
		if n := created[i].Load(); n != 1 {
			t.Errorf("group %d created by %d nodes, want 1", i, n)
		}
	}
}
