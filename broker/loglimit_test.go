package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

func TestLimitHandlerTruncatesAndRateLimits(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(newLimitHandler(slog.NewTextHandler(&buf, nil)))
	big := strings.Repeat("k", 40_000)
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "t", Payload: make([]byte, 100_000)}
	log.Warn("error processing packet", "client", "c1", "key", big, "pk", pk, "raw", make([]byte, 50_000))
	if buf.Len() > 2000 || strings.Contains(buf.String(), big[:300]) || !strings.Contains(buf.String(), "payload=100000 bytes") {
		t.Fatalf("line of %d bytes: %.400s", buf.Len(), buf.String())
	}
	buf.Reset()
	for range 100 {
		log.Warn("bad packet", "client", "flooder")
	}
	log.Warn("bad packet", "client", "other")
	if n := strings.Count(buf.String(), "\n"); n != logBurst+1 {
		t.Fatalf("%d lines passed, want %d for the flooder and 1 for another client", n, logBurst+1)
	}
	// The next window reports what was suppressed.
	st := newLimitHandler(slog.NewTextHandler(&buf, nil)).(*limitHandler).state
	now := time.Now()
	for range logBurst + 3 {
		st.admit("x", now)
	}
	if sup, ok := st.admit("x", now.Add(logWindow)); !ok || sup != 3 {
		t.Fatalf("after the window: %d suppressed, passed %v", sup, ok)
	}
}
