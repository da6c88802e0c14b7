package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Bounds of the limiting log handler.
const (
	// maxLogValue bounds a string or byte attribute, in bytes.
	maxLogValue = 256
	// logBurst lines of one kind (message and client) may pass per
	// logWindow; the rest are counted and reported with the next one that
	// passes.
	logBurst  = 5
	logWindow = 10 * time.Second
	// maxLogKinds bounds the kinds tracked at once.
	maxLogKinds = 10_000
)

// limitHandler keeps clients from using the log as an amplifier: mochi logs a
// malformed packet whole, payload included, and per-message lines repeat
// whatever a client sent. It truncates long string and byte attributes,
// replaces MQTT packets by a summary, and passes at most logBurst lines of
// one message for one client per logWindow.
type limitHandler struct {
	next  slog.Handler
	state *limitState
}

type limitState struct {
	mu    sync.Mutex
	kinds map[string]*logKind
}

type logKind struct {
	start      time.Time
	n          int
	suppressed int
}

func newLimitHandler(next slog.Handler) slog.Handler {
	return &limitHandler{next: next, state: &limitState{kinds: map[string]*logKind{}}}
}

func (h *limitHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *limitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = clampAttr(a)
	}
	return &limitHandler{next: h.next.WithAttrs(out), state: h.state}
}

func (h *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{next: h.next.WithGroup(name), state: h.state}
}

func (h *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	client := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "client" {
			client = a.Value.String()
		}
		return true
	})
	suppressed, ok := h.state.admit(r.Message+"\x00"+clipString(client), r.Time)
	if !ok {
		return nil
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(clampAttr(a))
		return true
	})
	if suppressed > 0 {
		out.AddAttrs(slog.Int("suppressed_similar", suppressed))
	}
	return h.next.Handle(ctx, out)
}

// admit reports whether a line of kind may pass at now, and how many of its
// kind were suppressed since the last that passed.
func (s *limitState) admit(kind string, now time.Time) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.kinds[kind]
	if k == nil {
		if len(s.kinds) >= maxLogKinds {
			clear(s.kinds)
		}
		k = &logKind{start: now}
		s.kinds[kind] = k
	}
	if now.Sub(k.start) >= logWindow {
		k.start, k.n = now, 0
	}
	if k.n >= logBurst {
		k.suppressed++
		return 0, false
	}
	k.n++
	sup := k.suppressed
	k.suppressed = 0
	return sup, true
}

// clampAttr truncates long values and summarises packets.
func clampAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); len(s) > maxLogValue {
			return slog.String(a.Key, clipString(s))
		}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case packets.Packet:
			return slog.String(a.Key, packetSummary(&x))
		case *packets.Packet:
			return slog.String(a.Key, packetSummary(x))
		case []byte:
			return slog.String(a.Key, fmt.Sprintf("%d bytes", len(x)))
		case error:
			if s := x.Error(); len(s) > maxLogValue {
				return slog.String(a.Key, clipString(s))
			}
		}
	case slog.KindGroup:
		as := v.Group()
		out := make([]slog.Attr, len(as))
		for i, g := range as {
			out[i] = clampAttr(g)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	}
	return a
}

func clipString(s string) string {
	if len(s) <= maxLogValue {
		return s
	}
	cut := maxLogValue
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:cut], len(s))
}

func packetSummary(pk *packets.Packet) string {
	return fmt.Sprintf("type=%d id=%d qos=%d topic=%q payload=%d bytes", pk.FixedHeader.Type, pk.PacketID, pk.FixedHeader.Qos,
		clipString(pk.TopicName), len(pk.Payload))
}
