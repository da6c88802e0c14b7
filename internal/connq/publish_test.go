package connq

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/frame"
)

// encodePub encodes a PUBLISH with mochi for version and parses it.
func encodePub(t testing.TB, version, qos byte, topic, payload string) *frame.Publish {
	t.Helper()
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos}, TopicName: topic,
		Payload: []byte(payload), ProtocolVersion: version}
	if qos > 0 {
		pk.PacketID = 1 // mochi needs one; each connection patches its own
	}
	var buf bytes.Buffer
	if err := pk.PublishEncode(&buf); err != nil {
		t.Fatal(err)
	}
	p, err := frame.Parse(buf.Bytes(), version, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// wireReader decodes the packets a Conn sends.
type wireReader struct {
	c       net.Conn
	r       *bufio.Reader
	version byte
}

func newWireReader(c net.Conn, version byte) *wireReader {
	return &wireReader{c: c, r: bufio.NewReader(c), version: version}
}

func (w *wireReader) next(t *testing.T) packets.Packet {
	t.Helper()
	if w.c != nil {
		_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	}
	h, err := w.r.ReadByte()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	var fh packets.FixedHeader
	if err := fh.Decode(h); err != nil {
		t.Fatal(err)
	}
	n, _, err := packets.DecodeLength(w.r)
	if err != nil {
		t.Fatal(err)
	}
	fh.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(w.r, body); err != nil {
		t.Fatal(err)
	}
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: w.version}
	if fh.Type == packets.Publish {
		if err := pk.PublishDecode(body); err != nil {
			t.Fatalf("decode % x: %v", body, err)
		}
	}
	return pk
}

func userProp(pk packets.Packet, key string) (string, bool) {
	for _, u := range pk.Properties.User {
		if u.Key == key {
			return u.Val, true
		}
	}
	return "", false
}

func TestTrackedPublishesCarryTheirIDAndDup(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprint("v", version), func(t *testing.T) {
			a, b := tcpPair(t)
			c := New(a, Limits{Soft: 1 << 20, Hard: 8 << 20}, nil, nil)
			defer closeAndWait(t, c)
			c.SetSession(Session{Version: version})
			small := encodePub(t, version, 1, "a/b", "small")
			large := encodePub(t, version, 2, "a/b", string(bytes.Repeat([]byte("L"), 3000)))
			orig := bytes.Clone(large.B)
			for i, p := range []*frame.Publish{small, large, small, large} {
				if err := c.EnqueueTracked(p, uint16(100+i), i >= 2, nil); err != nil {
					t.Fatal(err)
				}
			}
			r := newWireReader(b, version)
			for i, want := range []*frame.Publish{small, large, small, large} {
				pk := r.next(t)
				if pk.PacketID != uint16(100+i) || pk.FixedHeader.Dup != (i >= 2) || pk.FixedHeader.Qos != want.QoS ||
					pk.TopicName != "a/b" || !bytes.Equal(pk.Payload, want.Payload()) {
					t.Fatalf("frame %d: id %d dup %v qos %d topic %q (%d payload bytes)", i, pk.PacketID, pk.FixedHeader.Dup, pk.FixedHeader.Qos, pk.TopicName, len(pk.Payload))
				}
			}
			if !bytes.Equal(large.B, orig) {
				t.Fatal("the shared frame was modified")
			}
		})
	}
}

func TestTrackedPublishesWaitForRoom(t *testing.T) {
	c, g := parked(t, Limits{Soft: 100, Hard: 1000})
	p := encodePub(t, 4, 1, "t", "0123456789") // 17 bytes
	woken := make(chan struct{}, 1)
	wake := func() { woken <- struct{}{} }
	queued := 0
	for ; ; queued++ {
		err := c.EnqueueTracked(p, uint16(queued+1), false, wake)
		if errors.Is(err, ErrNoRoom) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if queued != 6 || c.Queued() != 6*len(p.B) {
		t.Fatalf("queued %d tracked publishes (%d bytes) below a room limit of 100", queued, c.Queued())
	}
	if _, err := c.Write(make([]byte, 50)); err != nil { // mochi frames still go in
		t.Fatal(err)
	}
	g.open()
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("wake not called once the queue drained")
	}
	closeAndWait(t, c)
}

func TestConflateKeepsTheNewestPerTopic(t *testing.T) {
	stats := new(Stats)
	g := newGated()
	c := New(g, Limits{Soft: 1 << 10, Hard: 1 << 20, Policy: Conflate}, stats, nil)
	c.Write([]byte("first"))
	waitFor(t, func() bool { return c.Queued() == 0 })
	seq := []string{"a", "b", "a", "c", "a", "b"}
	for i, topic := range seq {
		if !c.Enqueue(pubOn(topic, i)) {
			t.Fatalf("publish %d refused", i)
		}
	}
	if n := c.Conflated(); n != 3 || stats.Conflated.Load() != 3 {
		t.Fatalf("conflated %d (stats %d), want 3", n, stats.Conflated.Load())
	}
	// One per topic, each topic in its first place, each with its newest value.
	want := append(append(append([]byte("first"), pubOn("a", 4).B...), pubOn("b", 5).B...), pubOn("c", 3).B...)
	if c.Queued() != len(want)-5 {
		t.Fatalf("queued %d bytes, want %d", c.Queued(), len(want)-5)
	}
	g.open()
	waitFor(t, func() bool { return len(g.written()) >= len(want) })
	if got := g.written(); !bytes.Equal(got, want) {
		t.Fatalf("written %q\nwant    %q", got, want)
	}
	// Once written, a topic queues again.
	c.Enqueue(pubOn("a", 9))
	waitFor(t, func() bool { return len(g.written()) >= len(want)+len(pubOn("a", 9).B) })
	closeAndWait(t, c)
}

func TestConflateDropsTheOldestPastItsLimits(t *testing.T) {
	c, g := parked(t, Limits{Hard: 100, Policy: Conflate}) // 10 frames of 11 bytes do not fit
	for i := range 20 {
		c.Enqueue(pubOn(fmt.Sprintf("%02d", i), i)) // 11 bytes each, all distinct topics
	}
	if msgs, _ := c.Dropped(); msgs != 11 {
		t.Fatalf("dropped %d, want the 11 oldest", msgs)
	}
	if c.Conflated() != 0 {
		t.Fatalf("conflated %d distinct topics", c.Conflated())
	}
	// A dropped topic's index entry is gone: its next message queues anew.
	c.Enqueue(pubOn("19", 99))
	if c.Conflated() != 1 {
		t.Fatalf("conflated %d, want 1 (topic 19 is still queued)", c.Conflated())
	}
	g.open()
	closeAndWait(t, c)
}

func TestDropSignalCountsWhatTheClientMissed(t *testing.T) {
	stats := new(Stats)
	c, g := parked(t, Limits{Hard: 300, Policy: DropNewest})
	c.SetSession(Session{Version: 5, DropSignal: true})
	p := encodePub(t, 5, 0, "s", string(bytes.Repeat([]byte("x"), 90)))
	c.stats = stats
	sent, refused := 0, 0
	for range 20 {
		if c.Enqueue(p) {
			sent++
		} else {
			refused++
		}
	}
	c.AddMissed(7) // dropped elsewhere (a full outbox)
	g.open()
	waitFor(t, func() bool { return c.Queued() == 0 })
	last := encodePub(t, 5, 0, "s", "last")
	if !c.Enqueue(last) {
		t.Fatal("refused after the queue drained")
	}
	waitFor(t, func() bool { return bytes.HasSuffix(g.written(), last.B[len(last.B)-4:]) })
	got, signalled := 0, 0
	for _, pk := range decodeAll(t, g.written()[len("first"):], 5) {
		got++
		if v, ok := userProp(pk, DropSignalProperty); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			signalled += n
		}
	}
	if refused == 0 || got != sent+1 || signalled != refused+7 {
		t.Fatalf("sent %d, refused %d; received %d, signals add up to %d, want %d", sent, refused, got, signalled, refused+7)
	}
	if stats.DropSignals.Load() != 1 {
		t.Fatalf("%d drop signals, want 1", stats.DropSignals.Load())
	}
	closeAndWait(t, c)
}

// decodeAll decodes a run of whole packets.
func decodeAll(t *testing.T, b []byte, version byte) []packets.Packet {
	t.Helper()
	r := &wireReader{r: bufio.NewReader(bytes.NewReader(b)), version: version}
	var out []packets.Packet
	for r.r.Buffered() > 0 || len(out) == 0 {
		out = append(out, r.next(t))
		if _, err := r.r.Peek(1); err != nil {
			break
		}
	}
	return out
}

func TestTopicAliasesAreAssignedInWriteOrder(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Soft: 1 << 20, Hard: 8 << 20}, nil, nil)
	defer closeAndWait(t, c)
	c.SetSession(Session{Version: 5, TopicAliasMax: 2})
	topics := []string{"sensors/a", "sensors/b", "sensors/c", "sensors/a", "sensors/b", "sensors/c"}
	for i, topic := range topics {
		if i%2 == 0 {
			c.Enqueue(encodePub(t, 5, 0, topic, "q0"))
		} else if err := c.EnqueueTracked(encodePub(t, 5, 1, topic, "q1"), uint16(i), false, nil); err != nil {
			t.Fatal(err)
		}
	}
	r := newWireReader(b, 5)
	expectAliases(t, r, []aliased{{"sensors/a", 1}, {"sensors/b", 2}, {"sensors/c", 0}, {"", 1}, {"", 2}, {"sensors/c", 0}})
}

// aliased is a publish's topic and topic alias as the client reads them.
type aliased struct {
	topic string
	alias uint16
}

// expectAliases reads len(want) publishes from r and checks their topics and aliases.
func expectAliases(t *testing.T, r *wireReader, want []aliased) {
	t.Helper()
	for i, w := range want {
		pk := r.next(t)
		if pk.TopicName != w.topic || pk.Properties.TopicAlias != w.alias {
			t.Errorf("publish %d: topic %q alias %d, want %q alias %d", i, pk.TopicName, pk.Properties.TopicAlias, w.topic, w.alias)
		}
	}
}

// TestTopicAliasesAreBoundedInBytes: topics go without an alias once the
// table holds TopicAliasBytes of topics; those that have one keep it.
func TestTopicAliasesAreBoundedInBytes(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Soft: 1 << 20, Hard: 8 << 20}, nil, nil)
	defer closeAndWait(t, c)
	c.SetSession(Session{Version: 5, TopicAliasMax: 100, TopicAliasBytes: 20})
	for _, topic := range []string{"sensors/a", "sensors/b", "sensors/c", "s/d", "sensors/a"} {
		c.Enqueue(encodePub(t, 5, 0, topic, "x"))
	}
	r := newWireReader(b, 5)
	expectAliases(t, r, []aliased{{"sensors/a", 1}, {"sensors/b", 2}, {"sensors/c", 0}, {"s/d", 0}, {"", 1}})
}

func TestEditsRespectTheMaximumPacketSize(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Hard: 1 << 20, Policy: DropNewest}, nil, nil)
	defer closeAndWait(t, c)
	p := encodePub(t, 5, 0, "topic", "0123456789abcdef")
	c.SetSession(Session{Version: 5, DropSignal: true, TopicAliasMax: 5, MaxPacketSize: uint32(len(p.B))})
	c.AddMissed(3)
	c.Enqueue(p) // no room for the alias nor the signal
	small := encodePub(t, 5, 0, "t", "0")
	c.Enqueue(small) // room for both
	r := newWireReader(b, 5)
	first := r.next(t)
	if _, ok := userProp(first, DropSignalProperty); ok || first.Properties.TopicAlias != 0 || first.TopicName != "topic" {
		t.Fatalf("first publish %+v: edits that do not fit the maximum packet size", first.Properties)
	}
	second := r.next(t)
	if v, _ := userProp(second, DropSignalProperty); v != "3" || second.Properties.TopicAlias != 1 {
		t.Fatalf("second publish: signal %q alias %d, want 3 and 1", v, second.Properties.TopicAlias)
	}
}

func TestConflateShrinksTheKernelSendBuffer(t *testing.T) {
	a, _ := tcpPair(t)
	c := New(a, Limits{Hard: 1 << 20}, nil, nil)
	defer closeAndWait(t, c)
	sndbuf := func() int {
		raw, err := a.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var n int
		var serr error
		if err := raw.Control(func(fd uintptr) { n, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		return n
	}
	before := sndbuf()
	c.SetLimits(Limits{Hard: 1 << 20, Policy: Conflate})
	// Linux doubles the value set (bookkeeping overhead).
	if after := sndbuf(); after > 2*ConflateSendBuffer {
		t.Fatalf("SO_SNDBUF %d after conflate (was %d), want at most %d", after, before, 2*ConflateSendBuffer)
	}
}

func TestPublishesQueuedBeforeTheCONNACKGoAfterIt(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Hard: 1 << 20}, nil, nil)
	defer closeAndWait(t, c)
	c.AwaitConnack()
	early := encodePub(t, 4, 1, "t", "early")
	if err := c.EnqueueTracked(early, 7, true, nil); err != nil {
		t.Fatal(err)
	}
	c.Enqueue(pubN(1))
	if n := bufioReader(b).peek(); n != 0 {
		t.Fatalf("%d bytes sent before the CONNACK", n)
	}
	connack := []byte{0x20, 2, 0, 0}
	if _, err := c.Write(connack); err != nil {
		t.Fatal(err)
	}
	r := newWireReader(b, 4)
	if pk := r.next(t); pk.FixedHeader.Type != packets.Connack {
		t.Fatalf("first packet %v, want the CONNACK", pk.FixedHeader.Type)
	}
	if pk := r.next(t); pk.PacketID != 7 || string(pk.Payload) != "early" {
		t.Fatalf("second packet %+v", pk)
	}
	if pk := r.next(t); string(pk.Payload) != "[001]" {
		t.Fatalf("third packet %q", pk.Payload)
	}
}

func TestCloseWithoutCONNACKDropsWaitingPublishes(t *testing.T) {
	g := newGated()
	g.open()
	c := New(g, Limits{Hard: 1 << 20}, nil, nil)
	c.AwaitConnack()
	c.Enqueue(pubN(1))
	closeAndWait(t, c)
	if n := g.calls(); n != 0 {
		t.Fatalf("%d writes without a CONNACK", n)
	}
}
