package keyshared

import (
	"fmt"
	"log/slog"
	"time"
)

// Config configures one group's Dispatcher. Start from DefaultConfig.
type Config struct {
	// Group names the group in logs, stats and dead letters.
	Group string
	// MaxDeliveries is how many failed attempts (nacks, ack timeouts, member
	// losses) a message may have before the poison policy applies.
	MaxDeliveries int
	// Poison is what happens to a message that exhausted MaxDeliveries.
	Poison PoisonPolicy
	// AckTimeout is how long a delivered message may stay unacknowledged
	// before it is retried (the member is not evicted for it).
	AckTimeout time.Duration
	// RetryBackoffBase is the delay before the first retry; each further
	// failed attempt doubles it, up to RetryBackoffMax. Retries run on
	// heartbeats, so delays are rounded up to the next one.
	RetryBackoffBase time.Duration
	RetryBackoffMax  time.Duration
	// MemberMaxInflight caps the messages in flight to one member; a member's
	// MQTT Receive Maximum lowers it further.
	MemberMaxInflight int
	// Window caps the messages in flight plus blocked in the group. When it is
	// full the dispatcher stops reading the log.
	Window int
	// WindowBytes caps what the window keeps in bytes: its messages
	// (Message.Size) and its keys, idle ones included (at most a quarter of
	// it goes to idle keys, which leave first when the window is full), so a
	// backlog of large messages or of many keys cannot fill memory: reading
	// stops once the window holds this much (at least one message is always
	// read).
	WindowBytes int64
	// ReadBatch is the most messages read from the log in one call.
	ReadBatch int
	// Heartbeat is the period of the maintenance tick (ack timeouts, retries,
	// eviction, lag-driven reading, cursor persistence).
	Heartbeat time.Duration
	// EvictAfter is how many consecutive heartbeats a member may be inactive
	// (disconnected) before it is evicted and its in-flight messages requeued.
	EvictAfter int
	// Unordered lifts invariant 1 for the group: every message is a queue of
	// its own, so a key may have many messages in flight at once (up to the
	// member's limit). Messages are still handed out in log order, and a
	// member that takes them in order keeps them in order, also across its
	// loss (what it had in flight goes out again before what waited for
	// it); a retry goes out after messages read later. Routing still follows the message's key.
	// A bridge to another broker uses it to keep up to the remote's Receive
	// Maximum in flight on one connection.
	Unordered bool
	// Clock is the time source; nil means SystemClock().
	Clock Clock
	// Logger receives the dispatcher's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration DESIGN.md describes: 500 ms
// heartbeats, eviction after 6 of them, 1,000 in flight per member, a window
// of 10,000 messages or 8 MiB, dead-lettering after 5 failed attempts.
func DefaultConfig() Config {
	return Config{
		MaxDeliveries:     5,
		Poison:            PoisonDeadLetter,
		AckTimeout:        30 * time.Second,
		RetryBackoffBase:  time.Second,
		RetryBackoffMax:   time.Minute,
		MemberMaxInflight: 1000,
		Window:            10000,
		ReadBatch:         512,
		Heartbeat:         500 * time.Millisecond,
		EvictAfter:        6,
		WindowBytes:       8 << 20,
	}
}

// Validate reports the first field that cannot work; the error wraps
// ErrInvalidConfig.
func (c *Config) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("%w: %s = %v, want %s", ErrInvalidConfig, field, v, want)
	}
	switch {
	case c.MaxDeliveries < 1:
		return bad("MaxDeliveries", c.MaxDeliveries, ">= 1")
	case c.Poison < PoisonDeadLetter || c.Poison > PoisonBlock:
		return bad("Poison", uint8(c.Poison), PoisonPolicies.String())
	case c.AckTimeout <= 0:
		return bad("AckTimeout", c.AckTimeout, "> 0")
	case c.RetryBackoffBase < 0:
		return bad("RetryBackoffBase", c.RetryBackoffBase, ">= 0")
	case c.RetryBackoffMax < c.RetryBackoffBase:
		return bad("RetryBackoffMax", c.RetryBackoffMax, ">= RetryBackoffBase")
	case c.MemberMaxInflight < 1:
		return bad("MemberMaxInflight", c.MemberMaxInflight, ">= 1")
	case c.Window < 1:
		return bad("Window", c.Window, ">= 1")
	case c.ReadBatch < 1:
		return bad("ReadBatch", c.ReadBatch, ">= 1")
	case c.Heartbeat <= 0:
		return bad("Heartbeat", c.Heartbeat, "> 0")
	case c.EvictAfter < 1:
		return bad("EvictAfter", c.EvictAfter, ">= 1")
	case c.WindowBytes < 1:
		return bad("WindowBytes", c.WindowBytes, ">= 1")
	}
	return nil
}

// backoff is the retry delay after the given number of failed attempts (>= 1).
func (c *Config) backoff(attempts int) time.Duration {
	d := c.RetryBackoffBase
	for i := 1; i < attempts && d < c.RetryBackoffMax; i++ {
		d *= 2
	}
	return min(d, c.RetryBackoffMax)
}

func (c *Config) clock() Clock {
	if c.Clock == nil {
		return SystemClock()
	}
	return c.Clock
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger.With("group", c.Group)
}
