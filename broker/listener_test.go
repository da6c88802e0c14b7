package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// faultyListener fails Accept with the errors queued in fail, one per call,
// before it accepts for real.
type faultyListener struct {
	net.Listener
	fail  chan error
	fails atomic.Int32
}

func (l *faultyListener) Accept() (net.Conn, error) {
	select {
	case err := <-l.fail:
		l.fails.Add(1)
		return nil, err
	default:
		return l.Listener.Accept()
	}
}

// startFaulty starts a broker whose TCP listener fails the accepts queued on
// the returned channel (buffered: queue them before any connection is made).
func startFaulty(t *testing.T) (*Broker, *faultyListener) {
	t.Helper()
	cfg := testConfig(t)
	w := &tlogWriter{t: t}
	b, err := New(cfg, slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	fl := &faultyListener{Listener: b.mqttLns[0].ln, fail: make(chan error, 16)}
	b.mqttLns[0].ln = fl
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		w.done.Store(true)
	})
	return b, fl
}

// TestListenerRetriesTemporaryAcceptErrors: EMFILE, ENFILE and ECONNABORTED
// from Accept are retried with backoff (the listener accepted nothing more
// after the first one before the fix), and the broker stays ready.
func TestListenerRetriesTemporaryAcceptErrors(t *testing.T) {
	b, fl := startFaulty(t)
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED, syscall.EMFILE} {
		fl.fail <- &net.OpError{Op: "accept", Net: "tcp", Err: e}
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	c := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, b.Addr("tcp")), "after-accept-errors", true, nil)
	c.Subscribe(t, "a/b", 0)
	if n := fl.fails.Load(); n != 4 {
		t.Fatalf("%d accepts failed, want 4", n)
	}
	if code, body := httpGet(t, "http://"+b.Addr("http")+"/readyz"); code != 200 {
		t.Errorf("/readyz after temporary accept errors = %d %q, want 200", code, body)
	}
}

// TestListenerThatStopsMakesTheBrokerUnready: an accept error that is not
// temporary stops the listener; /readyz then answers 503 naming it (it said
// 200 before the fix, with nothing accepting).
func TestListenerThatStopsMakesTheBrokerUnready(t *testing.T) {
	b, fl := startFaulty(t)
	fl.fail <- errors.New("accept: the listener's socket is gone")
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	for deadline := time.Now().Add(mqtttest.Timeout); b.Ready(); <-poll.C {
		if time.Now().After(deadline) {
			t.Fatal("the broker is still ready with its only MQTT listener stopped")
		}
	}
	code, body := httpGet(t, "http://"+b.Addr("http")+"/readyz")
	if code != 503 || !strings.Contains(body, "tcp listener") || !strings.Contains(body, "socket is gone") {
		t.Errorf("/readyz = %d %q, want 503 naming the tcp listener and its error", code, body)
	}
}

func TestTemporaryAcceptErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "accept", Err: syscall.EMFILE}, true},
		{&net.OpError{Op: "accept", Err: syscall.ENFILE}, true},
		{fmt.Errorf("wrapped: %w", syscall.ECONNABORTED), true},
		{syscall.ENOBUFS, true},
		{net.ErrClosed, false},
		{errors.New("other"), false},
	} {
		if got := temporaryAcceptError(c.err); got != c.want {
			t.Errorf("temporaryAcceptError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestMemoryReleasedOnlyWhenQuiet(t *testing.T) {
	for _, c := range []struct {
		free, live, allocated uint64
		want                  bool
	}{
		{free: 40 << 20, live: 50 << 20, allocated: 512 << 10, want: true}, // quiet, much free
		{free: 40 << 20, live: 50 << 20, allocated: 8 << 20, want: false},  // busy
		{free: 4 << 20, live: 50 << 20, allocated: 0, want: false},         // little free
		{free: 9 << 20, live: 400 << 20, allocated: 0, want: false},        // free is small beside the live heap
	} {
		if got := decideRelease(c.free, c.live, c.allocated, false); got != c.want {
			t.Errorf("decideRelease(%d, %d, %d) = %v", c.free, c.live, c.allocated, got)
		}
	}
}

// A release just before a burst does not keep the burst's pages for
// memReleaseGap: once more than the live heap was allocated since, the
// next quiet look may release.
func TestMemoryReleasedAfterABurst(t *testing.T) {
	for _, c := range []struct {
		since              time.Duration
		sinceRelease, live uint64
		want               bool
	}{
		{since: 31 * time.Second, sinceRelease: 1 << 20, live: 50 << 20, want: true},  // the usual gap
		{since: 10 * time.Second, sinceRelease: 1 << 20, live: 50 << 20, want: false}, // no burst since: wait
		{since: 10 * time.Second, sinceRelease: 80 << 20, live: 50 << 20, want: true}, // a burst came and went
		{since: 2 * time.Second, sinceRelease: 80 << 20, live: 50 << 20, want: false}, // but not more often than memReleaseBurstGap
	} {
		if got, _ := releaseDue(c.since, c.sinceRelease, c.live); got != c.want {
			t.Errorf("releaseDue(%v, %d, %d) = %v", c.since, c.sinceRelease, c.live, got)
		}
	}
	// After a burst little need lie free yet (the release's GC frees the
	// rest), but the broker must be quiet.
	if _, burst := releaseDue(10*time.Second, 80<<20, 50<<20); !burst || !decideRelease(4<<20, 50<<20, 0, burst) {
		t.Error("no release after a burst with 4 MiB free")
	}
	if decideRelease(40<<20, 50<<20, 8<<20, true) {
		t.Error("a release while busy")
	}
}

// Connections arriving fast on a broker with many clients run the GC at
// gcBurstPercent until a releaser tick sees no new connection; slow arrivals
// or few clients leave GOGC alone.
func TestGCBurstWhileConnectionsArriveFast(t *testing.T) {
	normal := debug.SetGCPercent(200)
	defer debug.SetGCPercent(normal)
	gcPercent := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	many, few := func() int { return 5000 }, func() int { return 100 }
	t0 := time.Unix(1000, 0)

	var g burstGC
	for i := 0; i < 2*gcBurstAccepts; i++ {
		g.accepted(t0.Add(time.Duration(i)*time.Second/10), many) // 10 a second: slow
	}
	if g.bursts != 0 {
		t.Fatal("slow arrivals started a burst")
	}
	for i := 0; i < 2*gcBurstAccepts; i++ {
		g.accepted(t0.Add(time.Hour), few)
	}
	if g.bursts != 0 {
		t.Fatal("a broker with few clients started a burst")
	}
	for i := 0; i < 2*gcBurstAccepts; i++ {
		g.accepted(t0.Add(2*time.Hour), many)
	}
	if g.bursts != 1 || gcPercent() != gcBurstPercent {
		t.Fatalf("fast arrivals: %d bursts, GOGC %d; want 1, %d", g.bursts, gcPercent(), gcBurstPercent)
	}
	g.tick() // connections came since the last tick: the burst goes on
	if gcPercent() != gcBurstPercent {
		t.Fatalf("GOGC %d during the burst", gcPercent())
	}
	g.tick() // none since
	if gcPercent() != 200 {
		t.Fatalf("GOGC %d after the burst, want 200", gcPercent())
	}
}
