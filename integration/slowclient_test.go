package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// rawConnect dials addr and sends all of frame but its last cut bytes.
func rawConnect(t *testing.T, addr string, frame []byte, cut int) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write(frame[:len(frame)-cut]); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedWithin waits until the broker closes c (a read returns EOF or a
// reset) and returns when, failing the test after limit.
func closedWithin(t *testing.T, c net.Conn, limit time.Duration) time.Time {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	buf := make([]byte, 256)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue // a CONNACK or a DISCONNECT before the close
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after %v", limit)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded) || isReset(err) {
			return time.Now()
		}
		t.Fatalf("read: %v", err)
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read"
}

// TestSlowClientsHoldNoGoroutine: clients that send half a CONNECT and
// stop, or a CONNECT one byte a second, cost no goroutine and no more heap
// than an idle connected client, and are cut at the CONNECT timeout (10 s);
// a connected client that trickles half a PUBLISH is cut at 1.5 times its
// keep-alive, the trickle moving nothing. Before the connection layer each
// of them held a goroutine (two once connected) parked on its read.
func TestSlowClientsHoldNoGoroutine(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof")
	addr := p.addrs["tcp"]
	const n = 500
	base := sampleHeap(t, p)

	// Idle, connected clients, for the yardstick.
	var idle []net.Conn
	for i := range n {
		frame := mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: fmt.Sprintf("idle-%d", i), CleanStart: true, KeepAlive: 60})
		c := rawConnect(t, addr, frame, 0)
		idle = append(idle, c)
	}
	for _, c := range idle {
		r := mqttwire.NewReader(c, 64)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if pk, err := r.Next(); err != nil || pk.Type != mqttwire.TypeConnack {
			t.Fatalf("CONNACK: %v", err)
		}
	}
	withIdle := sampleHeap(t, p)
	idleHeap := (float64(withIdle.heap) - float64(base.heap)) / n
	for _, c := range idle {
		_ = c.Close()
	}
	waitFor(t, "the idle clients to be gone", func() bool { return p.metric(t, "keyline_clients_connected") == 0 })
	base = sampleHeap(t, p)

	// Half a CONNECT each, then nothing.
	started := time.Now()
	var slow []net.Conn
	for i := range n {
		frame := mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: fmt.Sprintf("slow-%d", i), CleanStart: true, KeepAlive: 60})
		slow = append(slow, rawConnect(t, addr, frame, len(frame)/2))
	}
	// One more sends its CONNECT a byte a second (it would take 20 s).
	trickler := rawConnect(t, addr, []byte{0}, 1)
	frame := mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: "trickle", CleanStart: true, KeepAlive: 60})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second) // the pace of the slow client itself
		defer tick.Stop()
		for _, b := range frame {
			if _, err := trickler.Write([]byte{b}); err != nil {
				return
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	withSlow := sampleHeap(t, p)
	slowHeap := (float64(withSlow.heap) - float64(base.heap)) / n
	t.Logf("heap per idle connected client %.0f B, per half CONNECT %.0f B; goroutines %d with %d half CONNECTs (%d before)",
		idleHeap, slowHeap, withSlow.goroutines, n, base.goroutines)
	if withSlow.goroutines > base.goroutines+8 {
		t.Errorf("%d goroutines with %d clients stuck in their CONNECT, %d before: a goroutine per connection", withSlow.goroutines, n, base.goroutines)
	}
	if slowHeap > idleHeap {
		t.Errorf("a half CONNECT costs %.0f B of heap, more than an idle client (%.0f B)", slowHeap, idleHeap)
	}
	// The CONNECT timeout is 10 s (the deadline in force may be up to 1 s later).
	for _, c := range append(slow, trickler) {
		at := closedWithin(t, c, 15*time.Second)
		if d := at.Sub(started); d < 9*time.Second {
			t.Fatalf("closed after %v, before the CONNECT timeout", d)
		}
	}
	waitFor(t, "the goroutines to be back", func() bool { return sampleHeap(t, p).goroutines <= base.goroutines+2 })

	// Connected with a 2 s keep-alive, then half a PUBLISH, a byte every 300 ms.
	kc := rawConnect(t, addr, mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version311, ClientID: "ka", CleanStart: true, KeepAlive: 2}), 0)
	r := mqttwire.NewReader(kc, 64)
	_ = kc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if pk, err := r.Next(); err != nil || pk.Type != mqttwire.TypeConnack {
		t.Fatalf("CONNACK: %v", err)
	}
	connacked := time.Now()
	pub := mqttwire.AppendPublish(nil, mqttwire.Version311, &mqttwire.Publish{Topic: "slow/loris", Payload: make([]byte, 200)})
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(300 * time.Millisecond) // the pace of the slow client itself
		defer tick.Stop()
		for _, b := range pub[:len(pub)/2] {
			if _, err := kc.Write([]byte{b}); err != nil {
				return
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	at := closedWithin(t, kc, 10*time.Second)
	if d := at.Sub(connacked); d < 2900*time.Millisecond || d > 6*time.Second {
		t.Fatalf("keep-alive 2 s: cut %v after the CONNACK, want 3-4 s (1.5 x keep-alive, up to 1 s later)", d)
	}
}
