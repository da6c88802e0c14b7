package connq

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/internal/frame"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gatedConn is a net.Conn whose writes block until the test opens the gate,
// so a test decides exactly when the writer makes progress.
type gatedConn struct {
	net.Conn // nil: only the methods below are used
	gate     chan struct{}
	mu       sync.Mutex
	writes   [][]byte // one entry per Write call
	closed   chan struct{}
	once     sync.Once
}

func newGated() *gatedConn {
	return &gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}
}

func (g *gatedConn) Write(p []byte) (int, error) {
	select {
	case <-g.gate:
	case <-g.closed:
		return 0, net.ErrClosed
	}
	g.mu.Lock()
	g.writes = append(g.writes, bytes.Clone(p))
	g.mu.Unlock()
	return len(p), nil
}

func (g *gatedConn) Close() error                     { g.once.Do(func() { close(g.closed) }); return nil }
func (g *gatedConn) SetWriteDeadline(time.Time) error { return nil }
func (g *gatedConn) SetDeadline(time.Time) error      { return nil }
func (g *gatedConn) SetReadDeadline(time.Time) error  { return nil }
func (g *gatedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (g *gatedConn) open()                            { close(g.gate) }

func (g *gatedConn) written() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return bytes.Join(g.writes, nil)
}

func (g *gatedConn) calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.writes)
}

func frameN(i int) []byte { return fmt.Appendf(nil, "[%03d]", i) } // 5 bytes

// pubN is a QoS 0 PUBLISH of 10 bytes on topic "t" with payload frameN(i).
func pubN(i int) *frame.Publish { return pubOn("t", i) }

func pubOn(topic string, i int) *frame.Publish {
	b := append([]byte{0x30, byte(2 + len(topic) + 5), 0, byte(len(topic))}, topic...)
	p, err := frame.Parse(append(b, frameN(i)...), 4, 0)
	if err != nil {
		panic(err)
	}
	return p
}

// parked returns a Conn whose writer has taken the first frame and is stuck
// writing it, so that every later frame stays queued.
func parked(t *testing.T, l Limits) (*Conn, *gatedConn) {
	t.Helper()
	g := newGated()
	c := New(g, l, nil, nil)
	if _, err := c.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.Queued() == 0 }) // taken by the writer, blocked in Write
	return c, g
}

// waitFor polls cond with a deadline; the writer runs on its own goroutine.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("condition not met within 5s")
		}
	}
}

func closeAndWait(t *testing.T, c *Conn) {
	t.Helper()
	_ = c.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("writer did not exit")
	}
}

func TestOrderKeptAndBatched(t *testing.T) {
	c, g := parked(t, Limits{Hard: 1 << 20})
	var want bytes.Buffer
	want.WriteString("first")
	for i := range 100 {
		if i%3 == 0 {
			if _, err := c.Write(frameN(i)); err != nil {
				t.Fatal(err)
			}
			want.Write(frameN(i))
		} else if !c.Enqueue(pubN(i)) {
			t.Fatalf("frame %d refused", i)
		} else {
			want.Write(pubN(i).B)
		}
	}
	g.open()
	waitFor(t, func() bool { return bytes.Equal(g.written(), want.Bytes()) })
	if n := g.calls(); n != 2 {
		t.Errorf("%d writes for 101 frames queued behind one: want 2 (the first, then one batch)", n)
	}
	closeAndWait(t, c)
}

func TestDropOldestKeepsTheNewest(t *testing.T) {
	c, g := parked(t, Limits{Hard: 100, Policy: DropOldest}) // room for 10 frames
	for i := range 30 {
		if !c.Enqueue(pubN(i)) {
			t.Fatalf("frame %d refused under drop-oldest", i)
		}
	}
	if msgs, b := c.Dropped(); msgs != 20 || b != 200 {
		t.Errorf("dropped %d frames / %d bytes, want 20 / 200", msgs, b)
	}
	g.open()
	var want bytes.Buffer
	want.WriteString("first")
	for i := 20; i < 30; i++ {
		want.Write(pubN(i).B)
	}
	waitFor(t, func() bool { return len(g.written()) >= want.Len() })
	if got := g.written(); !bytes.Equal(got, want.Bytes()) {
		t.Errorf("written %q, want the 10 newest %q", got, want.Bytes())
	}
	closeAndWait(t, c)
}

func TestDropOldestNeverDropsMochiFrames(t *testing.T) {
	c, g := parked(t, Limits{Hard: 100, Policy: DropOldest})
	if _, err := c.Write([]byte("ack01")); err != nil { // unsheddable
		t.Fatal(err)
	}
	for i := range 20 {
		c.Enqueue(pubN(i))
	}
	g.open()
	waitFor(t, func() bool { return c.Queued() == 0 && g.calls() == 2 })
	if got := string(g.written()); got[:10] != "firstack01" {
		t.Errorf("written %q: the acknowledgement must survive eviction", got)
	}
	closeAndWait(t, c)
}

func TestDropNewest(t *testing.T) {
	c, g := parked(t, Limits{Hard: 100, Policy: DropNewest})
	accepted := 0
	for i := range 30 {
		if c.Enqueue(pubN(i)) {
			accepted++
		}
	}
	if accepted != 10 {
		t.Errorf("accepted %d, want 10", accepted)
	}
	g.open()
	var want bytes.Buffer
	want.WriteString("first")
	for i := range 10 {
		want.Write(pubN(i).B)
	}
	waitFor(t, func() bool { return len(g.written()) >= want.Len() })
	if got := g.written(); !bytes.Equal(got, want.Bytes()) {
		t.Errorf("written %q, want the 10 oldest", got)
	}
	closeAndWait(t, c)
}

func TestDisconnectPolicyCutsTheConnection(t *testing.T) {
	stats := new(Stats)
	g := newGated()
	c := New(g, Limits{Hard: 100, Policy: Disconnect}, stats, nil)
	c.Write([]byte("first"))
	waitFor(t, func() bool { return c.Queued() == 0 })
	for i := range 10 {
		if !c.Enqueue(pubN(i)) {
			t.Fatalf("frame %d refused below the limit", i)
		}
	}
	if c.Enqueue(pubN(10)) {
		t.Fatal("frame past the hard limit accepted under disconnect")
	}
	select {
	case <-g.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("underlying connection not closed")
	}
	<-c.Done()
	if _, err := c.Write([]byte("late")); !errors.Is(err, ErrSlowConsumer) {
		t.Errorf("Write after the cut = %v, want ErrSlowConsumer", err)
	}
	if stats.SlowDisconnects.Load() != 1 {
		t.Errorf("SlowDisconnects = %d", stats.SlowDisconnects.Load())
	}
}

func TestMochiFramePastHardLimitCutsTheConnection(t *testing.T) {
	c, g := parked(t, Limits{Hard: 20, Policy: DropOldest})
	if _, err := c.Write(make([]byte, 15)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(make([]byte, 15)); !errors.Is(err, ErrSlowConsumer) {
		t.Fatalf("Write past the hard limit = %v, want ErrSlowConsumer", err)
	}
	select {
	case <-g.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("underlying connection not closed")
	}
	<-c.Done()
}

func TestSoftLimitGrace(t *testing.T) {
	c, g := parked(t, Limits{Soft: 40, Hard: 1000, Grace: 10 * time.Second, Policy: DropNewest})
	now := time.Unix(1000, 0)
	c.mu.Lock()
	c.now = func() time.Time { return now }
	c.mu.Unlock()
	for i := range 8 { // 80 bytes: above soft, within grace
		if !c.Enqueue(pubN(i)) {
			t.Fatalf("frame %d refused within the grace period", i)
		}
	}
	now = now.Add(11 * time.Second)
	if c.Enqueue(pubN(8)) {
		t.Fatal("frame accepted after the queue stayed above the soft limit past its grace")
	}
	g.open()
	waitFor(t, func() bool { return c.Queued() == 0 })
	if !c.Enqueue(pubN(9)) { // drained below soft: the clock restarts
		t.Fatal("frame refused after the queue drained")
	}
	closeAndWait(t, c)
}

func TestCloseFlushesQueuedFrames(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Hard: 1 << 20}, nil, nil)
	c.Write([]byte("CONNACK"))
	c.Enqueue(pubN(1))
	c.Write([]byte("-DISCONNECT"))
	c.Close()
	got, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "CONNACK"+string(pubN(1).B)+"-DISCONNECT" {
		t.Fatalf("peer read %q", got)
	}
	<-c.Done()
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close = %v, want net.ErrClosed", err)
	}
}

func TestParsePolicy(t *testing.T) {
	for i, name := range Policies {
		p, err := ParsePolicy(name)
		if err != nil || p != Policy(i+1) || p.String() != name {
			t.Errorf("ParsePolicy(%q) = %v, %v", name, p, err)
		}
	}
	if _, err := ParsePolicy("drop-all"); !errors.Is(err, ErrUnknownPolicy) {
		t.Errorf("ParsePolicy(drop-all) = %v", err)
	}
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

func TestHeldAckWaitsForItsDecisionAndKeepsOrder(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Hard: 1 << 20}, nil, nil)
	defer closeAndWait(t, c)
	r := bufioReader(b)

	ok := c.HoldAck(4, 7, true)
	bad := c.HoldAck(4, 8, true)
	early := c.HoldAck(4, 9, true)
	early.Fail(0x97)                // decided before mochi writes the frame
	c.Write([]byte{0x40, 2, 0, 7})  // PUBACK 7: held
	c.Enqueue(pubN(7))              // waits behind it
	c.Write([]byte{0x40, 2, 0, 8})  // PUBACK 8: held
	c.Write([]byte{0x40, 2, 0, 9})  // PUBACK 9: already failed
	c.Write([]byte{0x40, 2, 0, 10}) // not held
	if got := r.peek(); got != 0 {
		t.Fatalf("%d bytes left before any decision", got)
	}
	bad.Fail(0x97)
	if got := r.peek(); got != 0 {
		t.Fatalf("%d bytes left while PUBACK 7 is undecided", got)
	}
	ok.Release()
	want := []byte{0x40, 2, 0, 7}
	want = append(want, pubN(7).B...)
	want = append(want, 0x40, 3, 0, 8, 0x97, 0x40, 3, 0, 9, 0x97, 0x40, 2, 0, 10)
	if got := r.read(t, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("peer read % x\nwant          % x", got, want)
	}
}

// TestJoinedHold: two writes hold one acknowledgement; it goes once both
// released it, or as a failure as soon as one failed; a part that joins
// after the others released it (mochi has not written the frame yet) holds
// it again.
func TestJoinedHold(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Hard: 1 << 20}, nil, nil)
	defer closeAndWait(t, c)
	r := bufioReader(b)

	both := c.HoldAck(4, 1, true)
	if c.HoldAck(4, 1, true) != both {
		t.Fatal("a second hold of the frame did not join the first")
	}
	failing := c.HoldAck(4, 2, true)
	c.HoldAck(4, 2, true)
	late := c.HoldAck(4, 3, true)
	late.Release() // released before the second part joins
	if c.HoldAck(4, 3, true) != late {
		t.Fatal("a late part did not join")
	}
	c.Write([]byte{0x40, 2, 0, 1})
	c.Write([]byte{0x40, 2, 0, 2})
	c.Write([]byte{0x40, 2, 0, 3})
	both.Release()
	if got := r.peek(); got != 0 {
		t.Fatalf("%d bytes left while one part of PUBACK 1 is undecided", got)
	}
	both.Release()
	failing.Fail(0x80) // one failure decides
	want := []byte{0x40, 2, 0, 1, 0x40, 3, 0, 2, 0x80}
	if got := r.read(t, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("peer read % x\nwant          % x", got, want)
	}
	if got := r.peek(); got != 0 {
		t.Fatalf("PUBACK 3 went before its late part decided")
	}
	late.Release()
	if got := r.read(t, 4); !bytes.Equal(got, []byte{0x40, 2, 0, 3}) {
		t.Fatalf("peer read % x", got)
	}
}

func TestFailedHoldCutsAnMQTT311Connection(t *testing.T) {
	g := newGated()
	c := New(g, Limits{Hard: 1 << 20}, nil, nil)
	h := c.HoldAck(4, 1, false)
	if _, err := c.Write([]byte{0x40, 2, 0, 1}); err != nil {
		t.Fatal(err)
	}
	h.Fail(0x80)
	select {
	case <-g.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("connection not cut")
	}
	<-c.Done()
	if n := g.calls(); n != 0 {
		t.Fatalf("%d writes: the held acknowledgement must never be sent", n)
	}
}

// peerReader reads what a Conn sends, with a deadline.
type peerReader struct{ c net.Conn }

func bufioReader(c net.Conn) *peerReader { return &peerReader{c} }

// peek reports how many bytes arrive within a short window; it is only used
// to assert that nothing was sent yet, so a short window cannot cause a false pass
// of a positive assertion.
func (r *peerReader) peek() int {
	_ = r.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	buf := make([]byte, 64)
	n, _ := r.c.Read(buf)
	_ = r.c.SetReadDeadline(time.Time{})
	return n
}

func (r *peerReader) read(t *testing.T, n int) []byte {
	t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, n)
	if _, err := io.ReadFull(r.c, buf); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return buf
}

// TestSentFramesAreNeverDroppedAndCounted: frames given to Send survive
// eviction like mochi's, and count as messages sent, as Enqueue's do.
func TestSentFramesAreNeverDroppedAndCounted(t *testing.T) {
	g := newGated()
	var sent, packets, bytesSent int64
	stats := &Stats{InfoMessagesSent: &sent, InfoPacketsSent: &packets, InfoBytesSent: &bytesSent}
	c := New(g, Limits{Hard: 50, Policy: DropOldest}, stats, nil)
	if _, err := c.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.Queued() == 0 })
	if err := c.Send([]byte("pub01")); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		c.Enqueue(pubN(i))
	}
	g.open()
	waitFor(t, func() bool { return c.Queued() == 0 && atomic.LoadInt64(&sent) >= 2 })
	if got := string(g.written()); got[:10] != "firstpub01" {
		t.Errorf("written %q: the sent frame must survive eviction", got)
	}
	closeAndWait(t, c)
	if err := c.Send([]byte("late!")); err == nil {
		t.Error("Send on a closed connection succeeded")
	}
	// "first" came through Write: mochi counts it itself.
	if got, want := atomic.LoadInt64(&bytesSent), int64(len(g.written())-len("first")); got != want {
		t.Errorf("bytes counted %d, want %d", got, want)
	}
}

func TestSendPastTheHardLimitCutsTheConnection(t *testing.T) {
	c, _ := parked(t, Limits{Hard: 8})
	if err := c.Send([]byte("0123456789")); err != ErrSlowConsumer {
		t.Fatalf("Send past the hard limit: %v", err)
	}
	closeAndWait(t, c)
}

// deadlineConn records the read deadlines set on it.
type deadlineConn struct {
	*gatedConn
	set []time.Time
}

func (d *deadlineConn) SetReadDeadline(t time.Time) error { d.set = append(d.set, t); return nil }

// TestReadDeadlinesMoveOncePerSlack: mochi's per-packet deadline updates
// reach the socket only when the deadline in force is more than
// DeadlineSlack off, and the deadline in force is never earlier than asked.
func TestReadDeadlinesMoveOncePerSlack(t *testing.T) {
	d := &deadlineConn{gatedConn: newGated()}
	c := New(d, Limits{Hard: 1 << 20}, nil, nil)
	t0 := time.Unix(1_800_000_000, 0)
	asks := []time.Time{t0, t0.Add(100 * time.Millisecond), t0.Add(DeadlineSlack), t0.Add(DeadlineSlack + time.Millisecond), t0.Add(-time.Hour), {}}
	for _, at := range asks {
		if err := c.SetDeadline(at); err != nil {
			t.Fatal(err)
		}
	}
	want := []time.Time{t0.Add(DeadlineSlack), t0.Add(2*DeadlineSlack + time.Millisecond), t0.Add(-time.Hour + DeadlineSlack), {}}
	if len(d.set) != len(want) {
		t.Fatalf("deadlines set %v, want %v", d.set, want)
	}
	for i := range want {
		if !d.set[i].Equal(want[i]) {
			t.Fatalf("deadline %d: %v, want %v", i, d.set[i], want[i])
		}
	}
	closeAndWait(t, c)
}
