//go:build linux

package netpoll

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns both ends of a loopback TCP connection.
func pair(t testing.TB) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		done <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-done
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}

// reader is a Handler that reads everything into a channel and notes EOF.
type reader struct {
	got    chan []byte
	eof    chan error
	active atomic.Int32 // Handler runs in progress (must never exceed 1)
	over   atomic.Bool
	wakes  atomic.Int32
}

func newReader() *reader { return &reader{got: make(chan []byte, 1024), eof: make(chan error, 1)} }

func (r *reader) Ready(c *Conn) {
	if r.active.Add(1) > 1 {
		r.over.Store(true)
	}
	defer r.active.Add(-1)
	r.wakes.Add(1)
	buf := make([]byte, 7) // small: many reads per event
	for {
		n, err := c.Read(buf)
		if n > 0 {
			r.got <- append([]byte(nil), buf[:n]...)
		}
		if errors.Is(err, ErrWouldBlock) {
			return
		}
		if err != nil {
			c.Remove() // before reporting: the test checks Conns once it has the EOF
			select {
			case r.eof <- err:
			default:
			}
			return
		}
	}
}

func newPoller(t testing.TB, cfg Config) *Poller {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func collect(t *testing.T, r *reader, want int) []byte {
	t.Helper()
	var all []byte
	deadline := time.After(10 * time.Second)
	for len(all) < want {
		select {
		case b := <-r.got:
			all = append(all, b...)
		case <-deadline:
			t.Fatalf("got %d of %d bytes", len(all), want)
		}
	}
	return all
}

func TestReadsWhatArrivesAndEOF(t *testing.T) {
	p := newPoller(t, Config{})
	s, c := pair(t)
	r := newReader()
	pc, err := p.Add(s, r)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("hello, idle connection: these bytes come in one write")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, r, len(msg)); string(got) != string(msg) {
		t.Fatalf("got %q", got)
	}
	_ = c.Close()
	select {
	case err := <-r.eof:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("end: %v, want EOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EOF after the peer closed")
	}
	_ = pc
	if p.Stats().Conns.Load() != 0 {
		t.Fatalf("%d registered after Remove", p.Stats().Conns.Load())
	}
}

// Bytes sent before Add are reported by the registration itself.
func TestBytesBeforeAdd(t *testing.T) {
	p := newPoller(t, Config{})
	s, c := pair(t)
	if _, err := c.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, s, 5)
	r := newReader()
	if _, err := p.Add(s, r); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, r, 5); string(got) != "early" {
		t.Fatalf("got %q", got)
	}
}

// A read that comes back short drained the socket: the Handler's next Read
// says ErrWouldBlock without a system call, and bytes written later still
// arrive (they raise a new edge).
func TestShortReadSkipsTheNextRead(t *testing.T) {
	p := newPoller(t, Config{})
	s, c := pair(t)
	r := newReader()
	if _, err := p.Add(s, r); err != nil {
		t.Fatal(err)
	}
	for i, msg := range []string{"abc", "def", "ghijk"} { // each shorter than the reader's 7 bytes
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		if got := collect(t, r, len(msg)); string(got) != msg {
			t.Fatalf("write %d: got %q", i, got)
		}
	}
	st := p.Stats()
	// Each write's run read once and skipped its second read; a run may
	// find two writes at once, never a write left unread.
	if st.Skipped.Load() == 0 || st.Reads.Load() > 3 {
		t.Fatalf("%d reads, %d skipped: the read after a short one went to the kernel", st.Reads.Load(), st.Skipped.Load())
	}
}

// Bytes and the peer's close that arrive together (one event) end in EOF:
// the short read of the bytes does not hide the close.
func TestCloseWithTheLastBytes(t *testing.T) {
	p := newPoller(t, Config{})
	s, c := pair(t)
	if _, err := c.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	waitQueued(t, s, 4)
	waitHangup(t, s)
	r := newReader()
	if _, err := p.Add(s, r); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, r, 4); string(got) != "last" {
		t.Fatalf("got %q", got)
	}
	select {
	case err := <-r.eof:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("end: %v, want EOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EOF: the close that came with the last bytes was lost")
	}
}

// Many connections, many small writes from many goroutines: every byte
// arrives in order per connection, and no Handler ever runs twice at once.
func TestManyConnectionsInOrder(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	p := newPoller(t, Config{Workers: 2})
	const conns, writes = 50, 200
	readers := make([]*reader, conns)
	clients := make([]*net.TCPConn, conns)
	for i := range conns {
		s, c := pair(t)
		readers[i] = newReader()
		readers[i].got = make(chan []byte, writes*8)
		if _, err := p.Add(s, readers[i]); err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	sizes := make([][]int, conns)
	for i := range sizes {
		for range writes {
			sizes[i] = append(sizes[i], 1+rng.IntN(40))
		}
	}
	var wg sync.WaitGroup
	want := make([][]byte, conns)
	for i := range conns {
		for j, n := range sizes[i] {
			for k := range n {
				want[i] = append(want[i], byte(j+k))
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := 0
			for _, n := range sizes[i] {
				if _, err := clients[i].Write(want[i][off : off+n]); err != nil {
					t.Error(err)
					return
				}
				off += n
			}
		}()
	}
	wg.Wait()
	for i, r := range readers {
		got := collect(t, r, len(want[i]))
		if string(got) != string(want[i]) {
			t.Fatalf("connection %d: bytes out of order or lost", i)
		}
		if r.over.Load() {
			t.Fatalf("connection %d: Handler ran twice at once", i)
		}
	}
}

// Wake runs the Handler with nothing to read; Pause holds readiness back
// until Resume.
func TestWakePauseResume(t *testing.T) {
	p := newPoller(t, Config{})
	s, c := pair(t)
	r := newReader()
	pc, err := p.Add(s, r)
	if err != nil {
		t.Fatal(err)
	}
	waitWakes := func(n int32) {
		t.Helper()
		poll.Until(t, 10*time.Second, fmt.Sprintf("%d handler runs", n), func() bool { return r.wakes.Load() >= n })
	}
	before := r.wakes.Load()
	pc.Wake()
	waitWakes(before + 1)

	pc.Pause()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	// The event arrives while paused: nothing is read. Wait for it.
	poll.Until(t, 10*time.Second, "a readiness event while paused", func() bool { return pc.state.Load()&pending != 0 })
	select {
	case b := <-r.got:
		t.Fatalf("read %q while paused", b)
	default:
	}
	pc.Resume()
	if got := collect(t, r, 4); string(got) != "held" {
		t.Fatalf("got %q", got)
	}
}

// A closed connection's Read fails; Remove after Close is harmless.
func TestReadAfterClose(t *testing.T) {
	p := newPoller(t, Config{})
	s, _ := pair(t)
	pc, err := p.Add(s, HandlerFunc(func(*Conn) {}))
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if _, err := pc.Read(make([]byte, 8)); err == nil {
		t.Fatal("read on a closed connection succeeded")
	}
	pc.Remove()
	pc.Remove()
	if n := p.Stats().Conns.Load(); n != 0 {
		t.Fatalf("%d registered", n)
	}
}

// RemoveBeforeClose frees the registration at once; bytes that arrive
// before the close run no Handler, and the slot serves the next connection.
func TestRemoveBeforeClose(t *testing.T) {
	p := newPoller(t, Config{})
	s, c := pair(t)
	ran := make(chan struct{}, 16)
	pc, err := p.Add(s, HandlerFunc(func(*Conn) { ran <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	pc.RemoveBeforeClose()
	if n := p.Stats().Conns.Load(); n != 0 {
		t.Fatalf("%d registered after RemoveBeforeClose", n)
	}
	events := p.Stats().Events.Load()
	if _, err := c.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, s, 4)
	_ = s.Close()
	// The next connection takes the freed slot and is served; the first
	// one's late bytes ran nothing.
	s2, c2 := pair(t)
	r := newReader()
	if _, err := p.Add(s2, r); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Write([]byte("next")); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, r, 4); string(got) != "next" {
		t.Fatalf("got %q", got)
	}
	if len(ran) != 0 {
		t.Fatalf("the removed connection's Handler ran %d times (events %d -> %d)", len(ran), events, p.Stats().Events.Load())
	}
}

// waitQueued polls until the kernel holds n bytes to read on c.
func waitQueued(t *testing.T, c *net.TCPConn, n int) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, fmt.Sprintf("%d bytes queued", n), func() bool {
		var queued int
		_ = rc.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return queued >= n
	})
}

// waitHangup waits until the peer's close has reached c (POLLRDHUP).
func waitHangup(t *testing.T, c *net.TCPConn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the peer's close", func() bool {
		var ev int16
		_ = rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			if n, _ := unix.Poll(fds, 0); n > 0 {
				ev = fds[0].Revents
			}
		})
		return ev&unix.POLLRDHUP != 0
	})
}

func TestAddAfterClose(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	s, _ := pair(t)
	if _, err := p.Add(s, HandlerFunc(func(*Conn) {})); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close: %v", err)
	}
}

// TestWaitersHoldNoThread: a waiter waits for readiness as a goroutine
// parked in Go's runtime poller (or queued for its turn there), not in a
// blocking epoll_wait that holds an OS thread each: goroutine state "IO
// wait" or "semacquire", never "syscall". A blocked thread is what made
// every wake-up of an idle broker cost a P hand-off and kept the runtime's
// monitor polling.
func TestWaitersHoldNoThread(t *testing.T) {
	const waiters = 8
	p, err := New(Config{Waiters: waiters})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.sys.blocking {
		t.Fatal("the epoll descriptor is not polled by the runtime: waiters block in epoll_wait")
	}
	s, c := pair(t)
	r := newReader()
	pc, err := p.Add(s, r)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Remove()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if got := <-r.got; string(got) != "x" {
		t.Fatalf("read %q", got)
	}
	var states map[string]int
	poll.Until(t, 10*time.Second, fmt.Sprintf("%d waiters waiting", waiters), func() bool {
		states = waiterStates()
		n := 0
		for _, v := range states {
			n += v
		}
		return n == waiters && states["running"] == 0 && states["runnable"] == 0
	})
	if states["syscall"] > 0 {
		t.Fatalf("waiters by goroutine state: %v; %d hold a thread in a system call", states, states["syscall"])
	}
	t.Logf("waiters by goroutine state: %v", states)
}

// waiterStates counts the Poller waiter goroutines of this process by the
// state the runtime's goroutine dump gives them.
func waiterStates() map[string]int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	states := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "netpoll.(*Poller).waiter(") {
			continue
		}
		head, _, _ := strings.Cut(g, "\n") // goroutine 7 [IO wait, 2 minutes]:
		_, state, _ := strings.Cut(head, "[")
		state, _, _ = strings.Cut(state, "]")
		state, _, _ = strings.Cut(state, ",")
		states[state]++
	}
	return states
}
