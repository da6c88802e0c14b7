package cluster

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
)

var offsetsSeed = flag.Uint64("offsets.seed", 0, "seed of TestOffsetsAndState (0: random)")

func TestUpDownBatchRoundTrip(t *testing.T) {
	up := upBatch{epoch: 7, node: "node-a\x00xyz", seq: 3, items: []upItem{
		{kind: upResync},
		{kind: upJoin, member: "m1", qos: 2, recvMax: 10, filters: []string{"a*", "b?"}, limit: keyshared.PacketLimit{Max: 256, Version: 5, SubscriptionID: 7}},
		{kind: upJoin, member: "m0", qos: 1}, // no limit: the older upJoin form
		{kind: upResync, member: resyncEnd},
		{kind: upActive, member: "m1", active: true},
		{kind: upAck, member: "m1", offset: 42},
		{kind: upNack, member: "m2", offset: 43, reason: 0x80},
		{kind: upReject, member: "m2", offset: 44, reason: 0x99},
		{kind: upOutstanding, member: "m3", offset: 45, key: "k"},
		{kind: upAcked, member: "m3", offset: 46},
		{kind: upLeave, member: "m4"},
	}}
	got, err := decodeUpBatch(up.encode())
	if err != nil || !reflect.DeepEqual(got, up) {
		t.Fatalf("up batch: %v\n got %+v\nwant %+v", err, got, up)
	}
	down := downBatch{group: "abc", node: "node-b", epoch: 9, seq: 1, items: []downItem{
		{kind: downDeliver, member: "m1", offset: 5, attempt: 2, msg: []byte("payload")},
		{kind: downRevoke, member: "m1", offset: 4},
		{kind: downQoS0, member: "m2", offset: 0, attempt: 1, msg: []byte{}},
	}}
	gotd, err := decodeDownBatch(down.encode())
	if err != nil || gotd.group != down.group || gotd.node != down.node || len(gotd.items) != 3 || string(gotd.items[0].msg) != "payload" || gotd.items[1].kind != downRevoke {
		t.Fatalf("down batch: %v %+v", err, gotd)
	}
	// Truncations and garbage fail cleanly.
	enc := up.encode()
	for i := range len(enc) {
		if _, err := decodeUpBatch(enc[:i]); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	// A join without a packet limit keeps the bytes an older node reads.
	old := upBatch{epoch: 1, node: "n", seq: 1, items: []upItem{{kind: upJoin, member: "m", qos: 1, recvMax: 5, filters: []string{"a"}}}}
	if got, want := old.encode(), []byte{1, 1, 'n', 1, 1, upJoin, 1, 'm', 1, 5, 1, 1, 'a'}; !bytes.Equal(got, want) {
		t.Fatalf("join without a limit: % x, want % x", got, want)
	}
	if _, err := decodeDownBatch([]byte{0xff, 0xff, 0xff}); !errors.Is(err, errWire) {
		t.Fatalf("garbage: %v", err)
	}
}

// TestOffsetsAndState: the offset set against a map model, and the state
// record's round trip.
func TestOffsetsAndState(t *testing.T) {
	seed := *offsetsSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay with -offsets.seed %d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 1))
	var s offsets
	model := map[uint64]bool{}
	for range 2000 {
		a := uint64(r.IntN(500)) + 1
		b := a + uint64(r.IntN(4))
		s.add(a, b)
		for x := a; x <= b; x++ {
			model[x] = true
		}
	}
	for x := uint64(0); x < 510; x++ {
		if s.contains(x) != model[x] {
			t.Fatalf("contains(%d) = %v, model %v", x, s.contains(x), model[x])
		}
	}
	for i := 1; i < len(s.r); i++ {
		if s.r[i][0] <= s.r[i-1][1]+1 {
			t.Fatalf("ranges %v and %v touch", s.r[i-1], s.r[i])
		}
	}
	s.removeThrough(250)
	if s.contains(250) || s.contains(3) || s.contains(251) != model[251] {
		t.Fatal("removeThrough")
	}
	st := groupState{epoch: 3, cursor: 100, dropped: 2, dlqSeq: 9, members: 4, lastSeen: time.Unix(0, 12345)}
	st.resolved.add(102, 110)
	st.resolved.add(200, 200)
	got, err := decodeGroupState(st.encode())
	if err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("state: %v\n got %+v\nwant %+v", err, got, st)
	}
	if _, err := decodeGroupState([]byte{9}); err == nil {
		t.Fatal("bad version decoded")
	}
}

// TestAdoptions: what a new holder learns from resyncs decides what it
// delivers again.
func TestAdoptions(t *testing.T) {
	a := newAdoptions()
	a.outstanding("m1", 10, "k")
	a.outstanding("m2", 5, "k") // older than an outstanding message of its key: resolved since
	a.ackedEarly("m3", 20)
	msg := func(off uint64, key string) *keyshared.Message { return &keyshared.Message{Offset: off, Key: key} }
	if !a.resolvedByTakeover(msg(5, "k")) || !a.resolvedByTakeover(msg(9, "k")) {
		t.Fatal("earlier messages of an adopted key must be resolved")
	}
	if a.resolvedByTakeover(msg(10, "k")) || a.resolvedByTakeover(msg(11, "k")) || a.resolvedByTakeover(msg(9, "other")) {
		t.Fatal("the adopted message and later ones are not resolved")
	}
	if !a.resolvedByTakeover(msg(20, "j")) {
		t.Fatal("an early ack resolves its message")
	}
	// The dispatcher picks m9 for offset 10 (the ring changed): nothing is
	// sent, and m1's ack is handed over for m9.
	if adopted, ack := a.intercept("m9", 10); !adopted || ack {
		t.Fatal("intercept")
	}
	if m, ok := a.answer("m1", 10, true); !ok || m != "m9" {
		t.Fatalf("answer maps to %q %v", m, ok)
	}
	if adopted, _ := a.intercept("m9", 10); adopted {
		t.Fatal("an answered adoption is gone")
	}
	// An ack before the dispatcher delivered it: recorded, then acked at delivery.
	a.outstanding("m1", 30, "z")
	if _, ok := a.answer("m1", 30, true); ok {
		t.Fatal("an ack before delivery must not reach the dispatcher")
	}
	if adopted, ack := a.intercept("m1", 30); !adopted || !ack {
		t.Fatal("delivery after an early ack")
	}
}

// TestPreferredSpreads: rendezvous placement spreads groups over nodes and
// moves only the groups of a node that leaves.
func TestPreferredSpreads(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	count := map[string]int{}
	before := map[string]string{}
	for i := range 3000 {
		g := groupHash(fmt.Sprintf("g%d/x/#", i))
		p := preferred(g, nodes)
		count[p]++
		before[g] = p
	}
	for _, n := range nodes {
		if count[n] < 800 {
			t.Fatalf("uneven spread: %v", count)
		}
	}
	for g, p := range before {
		if q := preferred(g, []string{"node-a", "node-c"}); p != "node-b" && q != p {
			t.Fatalf("group %s moved from %s to %s although its node stayed", g, p, q)
		}
	}
}

// TestPipeRetriesInOrder: a batch that fails is sent again, numbered the
// same, and items keep their order.
func TestPipeRetriesInOrder(t *testing.T) {
	var mu sync.Mutex
	var got []int
	var seqs []uint64
	fails := 2
	done := make(chan struct{})
	p := newPipe(func(seq uint64, items []int) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		seqs = append(seqs, seq)
		if fails > 0 {
			fails--
			return nil, errors.New("lost")
		}
		got = append(got, items...)
		if len(got) == 100 {
			close(done)
		}
		return []byte{replyOK}, nil
	}, func([]int, []byte) {})
	for i := range 100 {
		if !p.push(i) {
			t.Fatal("push refused")
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("pipe stalled")
	}
	p.close()
	for i, v := range got {
		if v != i {
			t.Fatalf("order: %v", got)
		}
	}
	if seqs[0] != 1 || seqs[1] != 1 || seqs[2] != 1 {
		t.Fatalf("a retried batch must keep its number: %v", seqs)
	}
}

// emptyLog is a keyshared.Log that holds nothing.
type emptyLog struct{}

func (emptyLog) ReadFrom(_ uint64, _ int, buf []keyshared.Message) ([]keyshared.Message, error) {
	return buf, nil
}
func (emptyLog) Head() uint64                          { return 0 }
func (emptyLog) LoadCursor() (uint64, error)           { return 0, nil }
func (emptyLog) Resolve([]uint64)                      {}
func (emptyLog) DeadLetter(keyshared.DeadLetter) error { return nil }

type nopOut struct{}

func (nopOut) Deliver(string, *keyshared.Message, int) bool { return false }
func (nopOut) Revoke(string, uint64)                        {}

// TestHolderCountsDroppedAnswers: a member's answer that reaches a holder
// whose dispatcher closed (lease lost, handed over) is counted, not
// silently dropped.
func TestHolderCountsDroppedAnswers(t *testing.T) {
	d, err := keyshared.New(keyshared.DefaultConfig(), emptyLog{}, nopOut{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	g := &Groups{log: slog.New(slog.DiscardHandler)}
	h := &holder{g: g, name: "g/x", d: d}
	h.answer(upAck, "m", 1, 0)
	h.answer(upNack, "m", 2, 0x80)
	h.answer(upReject, "m", 3, 0x99)
	if n := g.Stats.AnswersDropped.Load(); n != 3 {
		t.Fatalf("dropped answers counted %d, want 3", n)
	}
}
