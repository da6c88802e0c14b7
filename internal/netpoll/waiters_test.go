//go:build linux

package netpoll

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
)

// blocker is a reader whose runs block while its gate is held.
type blocker struct {
	*reader
	gate    chan struct{} // a run blocks until it is closed, once block is set
	block   chan struct{} // closed: runs from now on block
	blocked chan struct{} // a run is blocking (buffered)
}

func newBlocker() *blocker {
	return &blocker{reader: newReader(), gate: make(chan struct{}), block: make(chan struct{}), blocked: make(chan struct{}, 1)}
}

func (b *blocker) Ready(c *Conn) {
	select {
	case <-b.block:
		select {
		case b.blocked <- struct{}{}:
		default:
		}
		<-b.gate
	default:
	}
	b.reader.Ready(c)
}

// quickRuns makes every run count as quick (a loaded machine can take a
// millisecond for any run), for tests of proven connections.
func quickRuns(t *testing.T) {
	old := slowRun
	slowRun = time.Hour
	t.Cleanup(func() { slowRun = old })
}

// echo writes s and waits until r read it.
func echo(t *testing.T, c *net.TCPConn, r *reader, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, r, len(s)); string(got) != s {
		t.Fatalf("read %q, want %q", got, s)
	}
}

// TestUnprovenHandlerRunsWithASpareWaiter: the first run of a connection
// (its CONNECT, which may restore a session) has a waiter started beside it
// before it runs, so when it blocks another connection is served at once,
// not after the watchdog.
func TestUnprovenHandlerRunsWithASpareWaiter(t *testing.T) {
	p := newPoller(t, Config{})
	s1, c1 := pair(t)
	s2, c2 := pair(t)
	b := newBlocker()
	close(b.block)
	other := newReader()
	if _, err := p.Add(s1, b); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Add(s2, other); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Write([]byte("connect")); err != nil {
		t.Fatal(err)
	}
	<-b.blocked
	echo(t, c2, other, "served")
	close(b.gate)
	if got := collect(t, b.reader, 7); string(got) != "connect" {
		t.Fatalf("blocked connection read %q", got)
	}
	if n := p.Stats().Rescues.Load(); n != 0 {
		t.Fatalf("%d rescues: the unproven run had no spare waiter", n)
	}
}

// TestProvenHandlerThatBlocksIsRescued: a connection proven quick runs with
// no spare waiter; when it blocks after all, the watchdog starts a waiter
// and the other connections are served meanwhile.
func TestProvenHandlerThatBlocksIsRescued(t *testing.T) {
	quickRuns(t)
	p := newPoller(t, Config{})
	s1, c1 := pair(t)
	s2, c2 := pair(t)
	b := newBlocker()
	other := newReader()
	if _, err := p.Add(s1, b); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Add(s2, other); err != nil {
		t.Fatal(err)
	}
	for i := range provenRuns + 1 {
		echo(t, c1, b.reader, fmt.Sprint(i))
		echo(t, c2, other, fmt.Sprint(i))
	}
	close(b.block)
	if _, err := c1.Write([]byte("stuck")); err != nil {
		t.Fatal(err)
	}
	<-b.blocked
	echo(t, c2, other, "served")
	if n := p.Stats().Rescues.Load(); n == 0 {
		t.Error("the other connection was served with no rescue: the proven run had a spare waiter")
	}
	close(b.gate)
	if got := collect(t, b.reader, 5); string(got) != "stuck" {
		t.Fatalf("blocked connection read %q", got)
	}
	// Once all are back, the extra waiters leave: one waits.
	poll.Until(t, 10*time.Second, "one waiter left", func() bool { return p.waiters.Load() == 1 && waiterCount() == 1 })
}

// TestProvenEventsNeedOneWaiter: events of proven connections start no
// waiter (each would be a thread woken for nothing) and arm no more than the
// watchdog.
func TestProvenEventsNeedOneWaiter(t *testing.T) {
	quickRuns(t)
	p := newPoller(t, Config{})
	s, c := pair(t)
	r := newReader()
	if _, err := p.Add(s, r); err != nil {
		t.Fatal(err)
	}
	echo(t, c, r, "connect") // unproven: a spare waiter
	poll.Until(t, 10*time.Second, "one waiter left", func() bool { return p.waiters.Load() == 1 })
	spawned := p.Stats().Spawned.Load()
	for i := range 50 {
		echo(t, c, r, fmt.Sprint(i%10))
	}
	if n := p.Stats().Spawned.Load() - spawned; n != 0 {
		t.Fatalf("%d waiters started for 50 events of a proven connection", n)
	}
}

// waiterCount counts the Poller waiter goroutines of this process.
func waiterCount() int {
	n := 0
	for _, v := range waiterStates() {
		n += v
	}
	return n
}
