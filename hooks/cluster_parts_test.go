package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/mochi-mqtt/server/v2/system"

	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// Unit tests of the cluster hook's parts (the top of cluster.go) with
// fakes of the node interfaces they depend on (cluster_forward_test.go)
// and an in-memory session store: no NATS. The broker's TestCluster* tests
// run the same parts end to end.

// fakeFloors is a floorSource: the node has read up to read, and a
// delivery in flight holds sequence hold (0: none).
type fakeFloors struct{ read, hold uint64 }

func (f *fakeFloors) readTo() uint64 { return f.read }

func (f *fakeFloors) bound(covered uint64) uint64 {
	if f.hold > 0 && f.hold-1 < covered {
		return f.hold - 1
	}
	return covered
}

// persistentClient is a disconnected (mochi: closed) MQTT 5 client with a
// session that outlives it.
func persistentClient(id string) *mqtt.Client {
	cl := &mqtt.Client{ID: id}
	cl.Properties.ProtocolVersion = 5
	cl.Properties.Props.SessionExpiryInterval = 3600
	return cl
}

type writerFixture struct {
	records *sessionstore.Memory
	table   *sessionTable
	floors  *fakeFloors
	w       *recordWriter
	stale   []string
}

func newWriterFixture() *writerFixture {
	f := &writerFixture{records: sessionstore.NewMemory(), table: newSessionTable(), floors: &fakeFloors{}}
	f.w = &recordWriter{records: f.records, table: f.table, floors: f.floors, stats: &ClusterStats{}, log: testLog,
		stale: func(s *clusterSession) { f.stale = append(f.stale, s.id) }}
	return f
}

// install writes rec and installs a copy of it for cl.
func (f *writerFixture) install(t *testing.T, cl *mqtt.Client, rec sessionstore.Record) *clusterSession {
	t.Helper()
	rev, err := f.records.Save(context.Background(), &rec, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := newClusterSession(cl.ID, cl, persistent(cl))
	s.rev, s.rec = rev, rec
	if err := f.table.install(s, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *writerFixture) load(t *testing.T, id string) (*sessionstore.Record, uint64) {
	t.Helper()
	rec, rev, err := f.records.Load(context.Background(), id)
	if err != nil || rec == nil {
		t.Fatalf("record of %s: %v %v", id, rec, err)
	}
	return rec, rev
}

// TestRecordWriterFloor: a record's floor stays below what the session's
// outbox holds, what is being delivered here and a restore's cap; it
// rises to the node's read position once they are resolved, and the
// acknowledged sequences it passes leave the record.
func TestRecordWriterFloor(t *testing.T) {
	ctx := context.Background()
	f := newWriterFixture()
	s := f.install(t, persistentClient("c"), sessionstore.Record{ClientID: "c", Owner: "a", Persistent: true, Floor: 10})
	out := clusterOutboxes{f.table}
	f.floors.read = 100
	out.Put("c", outbox.Stored{Seq: 1, Ref: 50})
	out.Put("c", outbox.Stored{Seq: 2, Ref: 70})
	out.Put("c", outbox.Stored{Seq: 3}) // no reference (QoS 0, retained): holds nothing
	f.w.flush(ctx, s, true)
	if rec, _ := f.load(t, "c"); rec.Floor != 49 {
		t.Fatalf("floor %d with sequence 50 in the outbox, want 49", rec.Floor)
	}
	out.Delete("c", 2, 70) // acknowledged
	f.w.flushAll()         // dirty: written
	if rec, _ := f.load(t, "c"); rec.Floor != 49 || !slices.Equal(rec.Acked, []uint64{70}) {
		t.Fatalf("after the ack of 70: floor %d acked %v, want 49 [70]", rec.Floor, rec.Acked)
	}
	out.Delete("c", 1, 50)
	f.floors.hold = 80 // a publish being delivered here
	f.w.flushAll()
	if rec, _ := f.load(t, "c"); rec.Floor != 79 || len(rec.Acked) != 0 {
		t.Fatalf("with 80 in flight: floor %d acked %v, want 79 and no acks at or below it", rec.Floor, rec.Acked)
	}
	f.floors.hold = 0
	s.mu.Lock()
	s.capped, s.floorCap = true, 90
	s.mu.Unlock()
	f.w.flush(ctx, s, true)
	if rec, _ := f.load(t, "c"); rec.Floor != 90 {
		t.Fatalf("capped at 90: floor %d", rec.Floor)
	}
	s.mu.Lock()
	s.capped = false
	s.mu.Unlock()
	_, before := f.load(t, "c")
	f.w.flushAll() // not dirty, the floor moved less than 10000: no write
	if _, rev := f.load(t, "c"); rev != before {
		t.Fatal("an unchanged session's record was written by the flusher")
	}
	out.Renumber("c")
	out.Put("c", outbox.Stored{Seq: 9, Ref: 95})
	f.w.flush(ctx, s, true)
	if rec, _ := f.load(t, "c"); rec.Floor != 94 {
		t.Fatalf("after a renumbering: floor %d, want 94", rec.Floor)
	}
}

// TestRecordWriterStaleCopy: a record write refused (another node wrote
// the record) drops the copy from the table and tells stale; one refused
// while this node is acquiring the id again keeps it (the acquisition
// replaces it).
func TestRecordWriterStaleCopy(t *testing.T) {
	ctx := context.Background()
	f := newWriterFixture()
	s := f.install(t, persistentClient("c"), sessionstore.Record{ClientID: "c", Owner: "a", Persistent: true})
	rec, rev := f.load(t, "c")
	rec.Owner = "b"
	if _, err := f.records.Save(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	f.table.begin("c")
	f.w.flush(ctx, s, true)
	if f.table.get("c") != s || len(f.stale) != 0 {
		t.Fatal("a refused write dropped the copy during an acquisition of its id")
	}
	f.table.end("c")
	f.w.flush(ctx, s, true)
	if f.table.get("c") != nil || !slices.Equal(f.stale, []string{"c"}) {
		t.Fatalf("a refused write: table %v, stale %v; want the copy gone and stale told", f.table.get("c"), f.stale)
	}
	if got, _ := f.load(t, "c"); got.Owner != "b" {
		t.Fatal("the other node's record was overwritten")
	}
	// A session that is not persistent has no record to write.
	f2 := newWriterFixture()
	cl := &mqtt.Client{ID: "clean"}
	cl.Properties.ProtocolVersion = 5
	s2 := f2.install(t, cl, sessionstore.Record{ClientID: "clean", Owner: "a"})
	_, before := f2.load(t, "clean")
	f2.w.flush(ctx, s2, true)
	if _, after := f2.load(t, "clean"); after != before {
		t.Fatal("a clean session's record was written")
	}
}

// TestRecordWriterWillSent: a will mochi sent leaves the record at the
// next write; one sent by another connection than the live one holding
// the session does not.
func TestRecordWriterWillSent(t *testing.T) {
	f := newWriterFixture()
	cl := persistentClient("c")
	s := f.install(t, cl, sessionstore.Record{ClientID: "c", Owner: "a", Persistent: true})
	s.will = &storedWill{Topic: "gone/c", Run: "r"}
	f.w.flush(context.Background(), s, true)
	rec, _ := f.load(t, "c")
	if st, ok := recordState(rec); !ok || willIn(st) == nil {
		t.Fatal("the record does not hold the will")
	}
	f.w.willSent(&mqtt.Client{ID: "c"}) // another (closed) client: mochi's delayed will, the copy counts
	f.w.flushAll()
	rec, _ = f.load(t, "c")
	if st, ok := recordState(rec); !ok || willIn(st) != nil {
		t.Fatal("the will is still in the record once sent")
	}
}

// TestInterest: the node's interest follows a session's subscriptions
// (each filter once, shared ones never), each subscription starts at the
// node's last sequence when it was made, and a persistent session's
// record gets them before the SUBACK.
func TestInterest(t *testing.T) {
	f := newWriterFixture()
	n := newFakeNode("a")
	in := &interest{node: n, table: f.table, writer: f.w, log: testLog}
	cl := persistentClient("c")
	s := f.install(t, cl, sessionstore.Record{ClientID: "c", Owner: "a", Persistent: true})
	n.last = 33
	sub := func(codes []byte, filters ...string) {
		pk := packets.Packet{}
		for _, fl := range filters {
			pk.Filters = append(pk.Filters, packets.Subscription{Filter: fl, Qos: 1})
		}
		in.subscribed(cl, pk, codes)
	}
	sub([]byte{1, 1, 0x87}, "a/#", "$share/g/k/#", "denied/#")
	if n.adds != 1 || !maps(n.interest, map[string]int{"a/#": 1}) {
		t.Fatalf("interest %v after %d adds, want a/# only", n.interest, n.adds)
	}
	in.add(context.Background(), s, "a/#", "a/#") // a restore of filters the copy holds already
	if n.interest["a/#"] != 1 {
		t.Fatalf("a/# registered %d times for one session", n.interest["a/#"])
	}
	if !s.takesQueued("a/x", 34) || s.takesQueued("a/x", 33) {
		t.Fatal("a/# must take queued messages after sequence 33 only")
	}
	rec, _ := f.load(t, "c")
	st, _ := recordState(rec)
	var filters []string
	for _, sub := range st.Subs {
		filters = append(filters, sub.Filter)
		if sub.Filter == "a/#" && sub.Since != 33 {
			t.Fatalf("a/# starts at %d in the record, want 33", sub.Since)
		}
	}
	if !slices.Equal(filters, []string{"$share/g/k/#", "a/#"}) {
		t.Fatalf("record subscriptions %q, want the granted ones", filters)
	}
	n.last = 40
	sub([]byte{2}, "a/#") // the same filter with other options: no new interest, same start
	if n.adds != 1 || !s.takesQueued("a/x", 35) {
		t.Fatalf("a resubscription registered the filter again (%d adds) or moved its start", n.adds)
	}
	in.unsubscribed(cl, packets.Packet{Filters: packets.Subscriptions{{Filter: "a/#"}, {Filter: "$share/g/k/#"}, {Filter: "never/#"}}})
	if len(n.interest) != 0 {
		t.Fatalf("interest %v after the UNSUBSCRIBE", n.interest)
	}
	rec, _ = f.load(t, "c")
	if st, _ := recordState(rec); len(st.Subs) != 0 {
		t.Fatalf("record keeps %d subscriptions", len(st.Subs))
	}
	sub([]byte{1}, "b/+")
	in.drop(s)
	if len(n.interest) != 0 || !s.released.Load() {
		t.Fatal("drop left interest behind")
	}
	in.subscribed(&mqtt.Client{ID: "c"}, packets.Packet{Filters: packets.Subscriptions{{Filter: "z"}}}, []byte{0})
	if n.interest["z"] != 0 {
		t.Fatal("a client without the installed copy registered interest")
	}
}

func maps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// fakeSessionNode is a sessionNode over fakeNode; RequestRelease and
// Announce are recorded.
type fakeSessionNode struct {
	*fakeNode
	onRelease func(owner, id string, rev uint64)
	replay    *fakeReplay
}

// fakeReplay is KL_MSGS as Replay reads it: msgs in order, then last (or,
// with err, the error after the messages up to errAfter).
type fakeReplay struct {
	msgs     []replayed
	last     uint64
	err      error
	errAfter uint64
}

type replayed struct {
	seq  uint64
	body []byte
}

func (n fakeSessionNode) RequestRelease(_ context.Context, owner, id string, rev uint64) error {
	n.mu.Lock()
	n.releases = append(n.releases, owner+" "+id)
	n.mu.Unlock()
	if n.onRelease != nil {
		n.onRelease(owner, id, rev)
	}
	return nil
}

func (n fakeSessionNode) Announce(id string, rev uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.announced[id] = rev
}

func (n fakeSessionNode) Replay(_ context.Context, _ []string, after uint64, fn func(uint64, []byte)) (uint64, error) {
	r := n.replay
	if r == nil {
		return after, nil
	}
	for _, m := range r.msgs {
		if r.err != nil && m.seq > r.errAfter {
			return 0, r.err
		}
		if m.seq > after {
			fn(m.seq, m.body)
		}
	}
	return r.last, r.err
}

type fakeOutboxes struct {
	mu       sync.Mutex
	dropped  []string
	requeued []string
	routes   int
	queued   []uint64 // the refs PrependSession was given
	upTo     uint64
}

func (o *fakeOutboxes) RequeueSession(id string, _ byte, msgs []outbox.Queued) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.requeued = append(o.requeued, id)
	return len(msgs)
}

func (o *fakeOutboxes) PrependSession(_ string, msgs []outbox.Queued, upTo uint64) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range msgs {
		o.queued = append(o.queued, m.Ref)
	}
	o.upTo = upTo
	return len(msgs)
}

func (o *fakeOutboxes) RoutesChanged() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.routes++
}

func (o *fakeOutboxes) DropSession(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropped = append(o.dropped, id)
}

type ownerFixture struct {
	*writerFixture
	node   *fakeNode
	replay *fakeReplay
	owner  *sessionOwner
	outs   *fakeOutboxes
	moved  []string
}

func newOwnerFixture(onRelease func(owner, id string, rev uint64)) *ownerFixture {
	f := &ownerFixture{writerFixture: newWriterFixture(), node: newFakeNode("a"), outs: &fakeOutboxes{}, replay: &fakeReplay{}}
	sn := fakeSessionNode{f.node, onRelease, f.replay}
	in := &interest{node: f.node, table: f.table, writer: f.w, log: testLog}
	f.owner = &sessionOwner{node: sn, records: f.records, server: mqtt.New(nil), table: f.table, interest: in, writer: f.w,
		run: "run-1", outboxes: func() SessionOutboxes { return f.outs }, moved: func(id string) { f.moved = append(f.moved, id) },
		stopping: context.Background(), stats: &ClusterStats{}, log: testLog}
	f.w.stale = f.owner.dropCopy
	return f
}

// TestSessionOwnerTakeover: a CONNECT for a persistent session another
// node owns asks that node to release it, writes the record as this
// node's over the revision it read (keeping the floor and acks), installs
// the copy capped at the floor until restored, and announces the owner.
func TestSessionOwnerTakeover(t *testing.T) {
	ctx := context.Background()
	f := newOwnerFixture(nil)
	st := sessionstate.Encode(nil, &sessionstate.State{Client: storage.Client{ID: "c", ProtocolVersion: 5}})
	old := sessionstore.Record{ClientID: "c", Owner: "b", Persistent: true, Floor: 12, Acked: []uint64{15}, State: st}
	rev, err := f.records.Save(ctx, &old, 0)
	if err != nil {
		t.Fatal(err)
	}
	cl := persistentClient("c")
	s, restore, err := f.owner.acquire(ctx, cl, false)
	if err != nil {
		t.Fatal(err)
	}
	if restore == nil || restore.Owner != "b" || restore.Floor != 12 {
		t.Fatalf("restore from %+v, want the record node b wrote", restore)
	}
	if !slices.Equal(f.node.releases, []string{"b c"}) {
		t.Fatalf("release requests %q, want one to node b", f.node.releases)
	}
	rec, nrev := f.load(t, "c")
	if rec.Owner != "a" || !rec.Connected || rec.Floor != 12 || !slices.Equal(rec.Acked, []uint64{15}) || nrev == rev {
		t.Fatalf("record %+v at %d, want node a's, connected, floor 12, acks [15], over revision %d", rec, nrev, rev)
	}
	if f.node.announced["c"] != nrev || f.table.current(cl) != s || s.revision() != nrev {
		t.Fatalf("announced %v, installed %v: want revision %d and the new copy", f.node.announced, f.table.current(cl), nrev)
	}
	if !s.capped || s.floorCap != 12 {
		t.Fatal("a copy to be restored is not capped at its record's floor")
	}

	// Node b takes it back at the revision written: the copy goes (its
	// last progress written first), the outbox is dropped, Moved is told.
	f.owner.release("c", nrev)
	if f.table.get("c") != nil || !slices.Equal(f.outs.dropped, []string{"c"}) || !slices.Equal(f.moved, []string{"c"}) {
		t.Fatalf("after the release: table %v, dropped %v, moved %v", f.table.get("c"), f.outs.dropped, f.moved)
	}
	if rec, _ := f.load(t, "c"); rec.Connected || rec.DisconnectedAt == 0 {
		t.Fatalf("the released copy's last record %+v: want it disconnected", rec)
	}
}

// TestSessionOwnerKeepsNewerCopy: a release request for an older revision
// than the copy this node holds (a late one) leaves it.
func TestSessionOwnerKeepsNewerCopy(t *testing.T) {
	ctx := context.Background()
	f := newOwnerFixture(nil)
	cl := persistentClient("c")
	s, _, err := f.owner.acquire(ctx, cl, true)
	if err != nil {
		t.Fatal(err)
	}
	f.owner.release("c", s.revision()-1)
	if f.table.get("c") != s || len(f.moved) != 0 {
		t.Fatal("a late release dropped a newer copy")
	}
}

// TestSessionOwnerRetriesAWriteInBetween: a record written by another
// node between this node's read and its compare-and-set makes the
// acquisition read again and take the session over that write.
func TestSessionOwnerRetriesAWriteInBetween(t *testing.T) {
	ctx := context.Background()
	var f *ownerFixture
	once := true
	f = newOwnerFixture(func(_, id string, _ uint64) {
		if !once {
			return
		}
		once = false
		rec, rev, _ := f.records.Load(ctx, id)
		rec.Floor = 20 // node b wrote its last progress meanwhile
		if _, err := f.records.Save(ctx, rec, rev); err != nil {
			t.Error(err)
		}
	})
	if _, err := f.records.Save(ctx, &sessionstore.Record{ClientID: "c", Owner: "b", Persistent: true, Floor: 10}, 0); err != nil {
		t.Fatal(err)
	}
	cl := persistentClient("c")
	s, restore, err := f.owner.acquire(ctx, cl, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.node.releases) != 2 || restore.Floor != 20 || f.table.current(cl) != s {
		t.Fatalf("releases %q, restored from floor %d: want a second read that saw node b's write", f.node.releases, restore.Floor)
	}
	if rec, _ := f.load(t, "c"); rec.Owner != "a" || rec.Floor != 20 {
		t.Fatalf("record %+v, want node a's from floor 20", rec)
	}
}

// saveThen is a session store that runs after once a Save succeeds.
type saveThen struct {
	sessionstore.Store
	after func(id string, rev uint64)
}

func (s saveThen) Save(ctx context.Context, rec *sessionstore.Record, rev uint64) (uint64, error) {
	nrev, err := s.Store.Save(ctx, rec, rev)
	if err == nil && s.after != nil {
		s.after(rec.ClientID, nrev)
	}
	return nrev, err
}

// TestSessionOwnerLosesToARelease: a release for the revision this node
// just wrote, arriving before it installed its copy, means another node
// took the session over that write: the copy is not installed and the
// CONNECT is refused with 0x88 (found by
// TestClusterConcurrentConnectsOneOwner).
func TestSessionOwnerLosesToARelease(t *testing.T) {
	ctx := context.Background()
	f := newOwnerFixture(nil)
	f.owner.records = saveThen{f.records, func(id string, rev uint64) { f.owner.release(id, rev) }}
	cl := persistentClient("c")
	if _, _, err := f.owner.acquire(ctx, cl, false); !errors.Is(err, errSuperseded) {
		t.Fatalf("acquire: %v, want errSuperseded", err)
	}
	if f.table.get("c") != nil {
		t.Fatal("a superseded copy was installed")
	}
	f.owner.refused.Store(cl, struct{}{})
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, SessionPresent: true}
	f.owner.encodePacket(cl, &pk)
	if pk.ReasonCode != packets.ErrServerUnavailable.Code || pk.SessionPresent {
		t.Fatalf("CONNACK of a refused connection: %#x present %v, want 0x88", pk.ReasonCode, pk.SessionPresent)
	}
	v3 := &mqtt.Client{ID: "v3"}
	v3.Properties.ProtocolVersion = 4
	f.owner.refused.Store(v3, struct{}{})
	pk = packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}}
	f.owner.encodePacket(v3, &pk)
	if pk.ReasonCode != packets.Err3ServerUnavailable.Code {
		t.Fatalf("3.1.1 CONNACK of a refused connection: %#x, want 0x03", pk.ReasonCode)
	}
}

// restoreRecord is node b's record of a persistent session: floor 10,
// sequence 12 acknowledged, an ordinary subscription from the start, one
// made at sequence 13 and a Key-Shared one with key filters.
func restoreRecord() sessionstore.Record {
	st := &sessionstate.State{Client: storage.Client{ID: "c", ProtocolVersion: 5},
		KeyFilters: map[string][]string{"$share/g/k/#": {"dev-1"}, "gone/#": {"x"}}}
	for _, sub := range []sessionstate.Sub{{Since: 0}, {Since: 13}, {Since: 0}} {
		st.Subs = append(st.Subs, sub)
	}
	st.Subs[0].Filter, st.Subs[0].Qos = "a/#", 1
	st.Subs[1].Filter, st.Subs[1].Qos = "b/#", 2
	st.Subs[2].Filter, st.Subs[2].Qos = "$share/g/k/#", 1
	return sessionstore.Record{ClientID: "c", Owner: "b", Persistent: true, Floor: 10, Acked: []uint64{12},
		State: sessionstate.Encode(nil, st)}
}

// replayOf puts messages (sequence, topic, QoS, ...) in KL_MSGS.
func (f *ownerFixture) replayOf(t *testing.T, msgs ...any) {
	t.Helper()
	for i := 0; i < len(msgs); i += 3 {
		body, err := encodeEnvelope(testPublish("far", msgs[i+1].(string), byte(msgs[i+2].(int))))
		if err != nil {
			t.Fatal(err)
		}
		f.replay.msgs = append(f.replay.msgs, replayed{uint64(msgs[i].(int)), body})
	}
}

// takeOver writes restoreRecord as node b's and connects its client here;
// it returns the client and the copy installed for it (nil: none).
func (f *ownerFixture) takeOver(t *testing.T) (*mqtt.Client, *clusterSession) {
	t.Helper()
	rec := restoreRecord()
	if _, err := f.records.Save(context.Background(), &rec, 0); err != nil {
		t.Fatal(err)
	}
	cl := persistentClient("c")
	f.owner.establish(cl, packets.Packet{})
	return cl, f.table.current(cl)
}

// TestSessionOwnerRestore: a session taken over from its record gets its
// filters into the node's interest (not the shared one's), its
// subscriptions into mochi's index under a placeholder, its key filters,
// and, in its outbox, every queued message above the floor that its
// subscriptions take at QoS 1/2, in order, without the acknowledged ones
// and those older than the subscription; the floor's cap goes once they
// are queued.
func TestSessionOwnerRestore(t *testing.T) {
	f := newOwnerFixture(nil)
	f.replayOf(t, 9, "a/old", 1, 11, "a/1", 1, 12, "a/acked", 1, 13, "b/before", 1, 14, "b/1", 1,
		15, "c/none", 1, 16, "a/qos0", 0, 17, "a/2", 2)
	f.replay.last = 20
	cl, s := f.takeOver(t)
	if s == nil {
		t.Fatal("no copy installed")
	}
	if !slices.Equal(f.outs.queued, []uint64{11, 14, 17}) || f.outs.upTo != 20 {
		t.Fatalf("queued %v up to %d, want [11 14 17] up to 20", f.outs.queued, f.outs.upTo)
	}
	if !slices.Equal(f.outs.requeued, []string{"c"}) || f.outs.routes != 1 || f.owner.stats.Restored.Load() != 3 {
		t.Fatalf("outbox requeued %v, routes %d, restored %d", f.outs.requeued, f.outs.routes, f.owner.stats.Restored.Load())
	}
	if !maps(f.node.interest, map[string]int{"a/#": 1, "b/#": 1}) {
		t.Fatalf("interest %v, want a/# and b/# (a group has a log of its own)", f.node.interest)
	}
	ph, ok := f.owner.server.Clients.Get("c")
	if !ok || ph == cl || ph.State.Subscriptions.Len() != 3 {
		t.Fatal("no placeholder holding the session's 3 subscriptions for mochi to resume")
	}
	if s.capped || s.replayedTo.Load() != 20 {
		t.Fatalf("capped %v, replayed to %d: want the cap gone and 20", s.capped, s.replayedTo.Load())
	}
	if got := (clusterKeyFilters{f.table}).KeyFilters(cl, "$share/g/k/#"); !slices.Equal(got, []string{"dev-1"}) {
		t.Fatalf("key filters %q, want [dev-1]", got)
	}
	if got := (clusterKeyFilters{f.table}).KeyFilters(cl, "gone/#"); got != nil {
		t.Fatalf("key filters of a subscription the session no longer has: %q", got)
	}
	if s.takesQueued("a/x", 20) || !s.takesQueued("a/x", 21) {
		t.Fatal("a queued message the replay covered would be delivered again")
	}
}

// TestSessionOwnerRestoreFails: a replay that fails part way leaves the
// floor capped at the last message it handled, so the next replay brings
// the rest.
func TestSessionOwnerRestoreFails(t *testing.T) {
	ctx := context.Background()
	f := newOwnerFixture(nil)
	f.replayOf(t, 11, "a/1", 1, 16, "b/1", 1, 17, "a/2", 1)
	f.replay.err, f.replay.errAfter = errors.New("replica gone"), 16
	_, s := f.takeOver(t)
	if s == nil || !s.capped || s.floorCap != 16 {
		t.Fatalf("after a failed replay: %+v, want the floor capped at 16", s)
	}
	if !slices.Equal(f.outs.queued, []uint64{11, 16}) {
		t.Fatalf("queued %v, want what the replay read", f.outs.queued)
	}
	// The outbox holds 11 and 16 (the fan-out reports them); the cap
	// keeps the floor at 16 however far the node has read, once they are
	// acknowledged.
	out := clusterOutboxes{f.table}
	out.Put("c", outbox.Stored{Seq: 1, Ref: 11})
	out.Put("c", outbox.Stored{Seq: 2, Ref: 16})
	f.floors.read = 100
	f.w.flush(ctx, s, true)
	if rec, _ := f.load(t, "c"); rec.Floor != 10 {
		t.Fatalf("floor %d with 11 in the outbox, want 10", rec.Floor)
	}
	out.Delete("c", 1, 11)
	out.Delete("c", 2, 16)
	f.w.flush(ctx, s, true)
	if rec, _ := f.load(t, "c"); rec.Floor != 16 {
		t.Fatalf("floor %d once both are acknowledged, want the cap 16 (17 was never read)", rec.Floor)
	}
}

// fakeClients is mochi's client list length.
type fakeClients int

func (c fakeClients) Len() int { return int(c) }

// TestSysFigures: one tick sends this node's figures (the messages it
// received from clients only) and publishes the totals over every node
// heard from, retained, on this node.
func TestSysFigures(t *testing.T) {
	n, j := newFakeNode("a"), &fakeInjector{}
	info := &system.Info{ClientsConnected: 3, Subscriptions: 5, MessagesReceived: 10}
	y := &sysFigures{node: n, mochi: nodeFigureSource{info: info, clients: fakeClients(4)}, inject: j,
		inline: inlineClient(clusterSysClient), stats: &ClusterStats{}, log: testLog}
	y.stats.Injected.Store(2)
	now := time.Unix(1_800_000_000, 0)
	y.nodes.heard([]byte(`{"node":"b","clients_connected":7,"sessions":1,"messages_received":100}`), now)
	y.tick(now)
	var sent nodeFigures
	if len(n.stats) != 1 || json.Unmarshal(n.stats[0], &sent) != nil {
		t.Fatalf("node stats sent: %q", n.stats)
	}
	if sent.Node != "a" || sent.ClientsConnected != 3 || sent.Sessions != 4 || sent.MessagesReceived != 8 {
		t.Fatalf("sent %+v, want node a, 3 connected, 4 sessions, 8 received from clients", sent)
	}
	got := map[string]string{}
	for _, p := range j.packets() {
		if p.cl != y.inline || !p.pk.FixedHeader.Retain {
			t.Fatalf("%s not a retained publish of the $SYS client", p.pk.TopicName)
		}
		got[p.pk.TopicName] = string(p.pk.Payload)
	}
	for topic, want := range map[string]string{
		"$SYS/broker/cluster/node": "a", "$SYS/cluster/nodes": "2", "$SYS/cluster/clients/connected": "10",
		"$SYS/cluster/sessions": "5", "$SYS/cluster/messages/received": "108", "$SYS/cluster/subscriptions": "5",
	} {
		if got[topic] != want {
			t.Errorf("%s = %q, want %q", topic, got[topic], want)
		}
	}
	if y.stats.Injected.Load() != 2+8 {
		t.Fatalf("injected %d, want the 8 $SYS publishes counted", y.stats.Injected.Load())
	}
	y.tick(now.Add(nodeStale + time.Second))
	if figs := y.figures(now.Add(nodeStale + time.Second)); len(figs) != 1 {
		t.Fatalf("%d nodes once b fell silent, want this one", len(figs))
	}
}

func newTestWillWatch(n *fakeNode, records sessionstore.Store, j *fakeInjector, heard map[string]time.Time) *willWatch {
	return &willWatch{node: n, records: records, run: "run-now", maxExpiry: 7 * 24 * 3600,
		heard: func() map[string]time.Time { return heard }, inject: j, inline: inlineClient(clusterWillClient),
		stats: &ClusterStats{}, log: testLog, pending: map[string]pendingWill{}, gone: map[string]bool{}}
}

func willState(topic, run string, delay, expiry uint32) []byte {
	st := &sessionstate.State{Client: storage.Client{ProtocolVersion: 5,
		Properties: storage.ClientProperties{SessionExpiryInterval: expiry, SessionExpiryIntervalFlag: true}}}
	(&storedWill{Topic: topic, Payload: []byte("bye"), Qos: 1, Delay: delay, Run: run}).put(st)
	return sessionstate.Encode(nil, st)
}

// TestWillWatch: the wills in records of gone nodes (and of this node's
// earlier runs) are published once due, each by a claim on the record's
// revision: a clean session's record goes, a persistent one's keeps
// without the will; the wills of live nodes, of this run and of records
// changed since they were found are not published.
func TestWillWatch(t *testing.T) {
	ctx := context.Background()
	records := sessionstore.NewMemory()
	n, j := newFakeNode("a"), &fakeInjector{}
	n.alive["node-b"] = true
	w := newTestWillWatch(n, records, j, nil)
	now := time.Now()
	for _, rec := range []sessionstore.Record{
		{ClientID: "gone-clean", Owner: "node-gone", Connected: true, State: willState("w/clean", "r", 60, 0)},
		{ClientID: "gone-delay", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Add(-10 * time.Second).Unix(), State: willState("w/delay", "r", 60, 3600)},
		{ClientID: "gone-moved", Owner: "node-gone", Persistent: true, DisconnectedAt: now.Unix(), State: willState("w/moved", "r", 0, 3600)},
		{ClientID: "live", Owner: "node-b", Connected: true, State: willState("w/live", "r", 0, 0)},
		{ClientID: "mine-now", Owner: "a", Connected: true, State: willState("w/now", "run-now", 0, 0)},
		{ClientID: "mine-before", Owner: "a", Connected: true, State: willState("w/before", "run-old", 0, 0)},
	} {
		if _, err := records.Save(ctx, &rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	w.scan(ctx, nil, now)
	// Taken over after it was found: its record moved on, the will is not
	// this watch's any more.
	rec, rev, _ := records.Load(ctx, "gone-moved")
	rec.Owner = "node-b"
	if _, err := records.Save(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	topics := func() []string {
		var out []string
		for _, p := range j.packets() {
			if p.cl != w.inline || p.pk.FixedHeader.Qos != 1 {
				t.Fatalf("will %s published by %s at QoS %d", p.pk.TopicName, p.cl.ID, p.pk.FixedHeader.Qos)
			}
			out = append(out, p.pk.TopicName)
		}
		slices.Sort(out)
		return out
	}
	w.claimDue(ctx, now)
	if got := topics(); !slices.Equal(got, []string{"w/before", "w/clean"}) {
		t.Fatalf("due at once: %q, want the clean session's and this node's earlier run's", got)
	}
	for _, id := range []string{"gone-clean", "mine-before"} {
		if rec, _, _ := records.Load(ctx, id); rec != nil {
			t.Errorf("%s: the record of a clean session whose will went out is kept", id)
		}
	}
	w.claimDue(ctx, now.Add(49*time.Second))
	if got := topics(); len(got) != 2 {
		t.Fatalf("published %q before the will delay ran out", got)
	}
	w.claimDue(ctx, now.Add(51*time.Second))
	if got := topics(); !slices.Equal(got, []string{"w/before", "w/clean", "w/delay"}) {
		t.Fatalf("published %q, want w/delay too once its delay ran out", got)
	}
	rec, _, _ = records.Load(ctx, "gone-delay")
	if st, ok := recordState(rec); rec == nil || !ok || willIn(st) != nil {
		t.Fatal("a persistent session's record must stay, without its will")
	}
	if w.stats.Wills.Load() != 3 || len(w.pending) != 0 {
		t.Fatalf("wills %d, pending %v", w.stats.Wills.Load(), w.pending)
	}
	w.scan(ctx, nil, now)
	w.claimDue(ctx, now.Add(time.Hour))
	if got := topics(); len(got) != 3 {
		t.Fatalf("a will went out twice: %q", got)
	}
}

// TestWillWatchSilentNodes: a node not heard from for willSilent that NATS
// has no responder for is gone, once until it is heard again; one that
// answers is not.
func TestWillWatchSilentNodes(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	heard := map[string]time.Time{"quiet": now.Add(-willSilent - time.Second), "answers": now.Add(-time.Hour), "fresh": now}
	n := newFakeNode("a")
	n.alive["answers"] = true
	w := newTestWillWatch(n, sessionstore.NewMemory(), &fakeInjector{}, heard)
	ctx := context.Background()
	if dead := w.silentGone(ctx, now); len(dead) != 1 || !dead["quiet"] {
		t.Fatalf("gone: %v, want quiet", dead)
	}
	if n.asked["fresh"] != 0 {
		t.Fatal("a node heard from recently was asked")
	}
	if dead := w.silentGone(ctx, now); len(dead) != 0 || n.asked["quiet"] != 1 {
		t.Fatalf("second look: %v, quiet asked %d times; want it found once", dead, n.asked["quiet"])
	}
	heard["quiet"] = now
	w.silentGone(ctx, now)
	heard["quiet"] = now.Add(-willSilent - time.Second)
	if dead := w.silentGone(ctx, now); !dead["quiet"] {
		t.Fatal("a node heard again and then silent again is not found gone again")
	}
}
