package broker

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestShutdownWhileClientsLeave: clients disconnecting while the broker
// shuts down are swept or gone, and the shutdown ends.
func TestShutdownWhileClientsLeave(t *testing.T) {
	for round := range 3 {
		b, err := New(testConfig(t), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(); err != nil {
			t.Fatal(err)
		}
		var conns []net.Conn
		for i := range 40 {
			conns = append(conns, connect311(t, b.Addr("tcp"), "leaver-"+strconv.Itoa(round)+"-"+strconv.Itoa(i)))
		}
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() { _ = c.Close() })
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = b.Shutdown(ctx)
		cancel()
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: shutdown with clients leaving: %v", round, err)
		}
	}
}

// connect311 opens an MQTT 3.1.1 connection as client id and reads its CONNACK.
func connect311(t *testing.T, addr, id string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	body := append([]byte{0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 60, 0, byte(len(id))}, id...)
	if _, err := c.Write(append([]byte{0x10, byte(len(body))}, body...)); err != nil {
		t.Fatal(err)
	}
	ack := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, ack); err != nil || ack[0] != 0x20 || ack[3] != 0 {
		t.Fatalf("CONNACK %x: %v", ack, err)
	}
	return c
}

// TestExpiredSessionsLeaveTheTopicIndex: a persistent session that expires
// takes its subscriptions out of mochi's topic index (mochi deletes the
// client only), so expired sessions leave nothing behind.
func TestExpiredSessionsLeaveTheTopicIndex(t *testing.T) {
	b := startBroker(t, testConfig(t))
	w, err := mqtttest.DialWorker(b.Addr("tcp"), "short-lived", mqtttest.WorkerOptions{CleanStart: true, SessionExpiry: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"p/x", "p/+/y/#"} {
		if rc, err := w.Subscribe(f, 1); err != nil || rc != 1 {
			t.Fatalf("subscribe %s: %#x %v", f, rc, err)
		}
	}
	w.Close()
	waitFor(t, mqtttest.Timeout, "the session to expire", func() bool {
		_, ok := b.server.Clients.Get("short-lived")
		return !ok
	})
	for _, topic := range []string{"p/x", "p/a/y/z"} {
		if subs := b.server.Topics.Subscribers(topic); len(subs.Subscriptions) != 0 {
			t.Errorf("%s: the expired session is still indexed: %v", topic, subs.Subscriptions)
		}
	}
	if n := atomic.LoadInt64(&b.server.Info.Subscriptions); n != 0 {
		t.Errorf("$SYS counts %d subscriptions after the only session expired", n)
	}
}
