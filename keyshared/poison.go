package keyshared

import (
	"time"

	"github.com/keyline-mq/keyline/internal/enum"
)

// PoisonPolicy says what happens to a message that failed MaxDeliveries times.
// The zero value means "not set": a Config with it is invalid, and settings
// that override others leave the policy alone.
type PoisonPolicy uint8

const (
	// PoisonDeadLetter records the message through Log.DeadLetter, then lets
	// the key go on. It is the default.
	PoisonDeadLetter PoisonPolicy = iota + 1
	// PoisonDrop discards the message (counted) and lets the key go on.
	PoisonDrop
	// PoisonBlock keeps the message at the head of its key: that key stops
	// (other keys go on) until a late ack from its last member resolves it.
	// The cursor cannot pass it, so the key's later messages stay in the
	// window and, if the key keeps receiving, eventually fill it.
	PoisonBlock
)

// Reason codes that mean "never retry": a member answering with one rejects
// the message and it is dead-lettered at once, whatever the poison policy.
const (
	ReasonNotAuthorized        byte = 0x87
	ReasonPayloadFormatInvalid byte = 0x99
)

// NeverRetry reports whether an MQTT reason code from a member means the
// message must be dead-lettered without retry.
func NeverRetry(reason byte) bool {
	return reason == ReasonNotAuthorized || reason == ReasonPayloadFormatInvalid
}

// PoisonPolicies names the policies, in value order: the one list of names
// that flags, the config file and the admin API use.
var PoisonPolicies = enum.Names{"dead-letter", "drop", "block"}

// String returns the policy's configuration name.
func (p PoisonPolicy) String() string { return PoisonPolicies.Name(uint8(p)) }

// ParsePoisonPolicy parses "dead-letter", "drop" or "block".
func ParsePoisonPolicy(s string) (PoisonPolicy, error) {
	v, err := PoisonPolicies.Parse("poison-policy", s, ErrInvalidPoisonPolicy)
	return PoisonPolicy(v), err
}

// UnmarshalText parses the policy from YAML and other text formats.
func (p *PoisonPolicy) UnmarshalText(b []byte) error {
	v, err := ParsePoisonPolicy(string(b))
	if err == nil {
		*p = v
	}
	return err
}

// MarshalText prints the policy's name.
func (p PoisonPolicy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// Set makes *PoisonPolicy a flag value (pflag.Value).
func (p *PoisonPolicy) Set(s string) error { return p.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (p *PoisonPolicy) Type() string { return "policy" }

// failed handles a message whose attempt just failed (its attempts already
// counted, it is no longer in flight): retry after backoff, or apply the
// poison policy once MaxDeliveries is reached.
func (c *core) failed(e *entry, now time.Time) {
	if e.attempts >= c.cfg.MaxDeliveries {
		c.poison(e, now)
		return
	}
	e.state = entryRetry
	e.retryAt = now.Add(c.cfg.backoff(e.attempts))
	c.w.retries.push(e)
	c.w.markKey(e.ks)
}

// poison applies the poison policy to e, the head of its key, not in flight.
func (c *core) poison(e *entry, now time.Time) {
	switch c.cfg.Poison {
	case PoisonDrop:
		c.logger.Warn("keyshared: dropping poison message", "offset", e.msg.Offset, "key", e.msg.Key, "attempts", e.attempts)
		c.finish(e, outDropped, now)
	case PoisonBlock:
		c.logger.Warn("keyshared: poison message blocks its key", "offset", e.msg.Offset, "key", e.msg.Key, "attempts", e.attempts)
		e.state = entryPoisoned
		c.w.poisoned++
		c.w.markKey(e.ks)
	default:
		c.deadLetter(e, now)
	}
}

// deadLetter records e in the log's dead letters and resolves it. When the
// store fails, e stays at the head of its key (the cursor cannot pass it) and
// the heartbeat tries again.
func (c *core) deadLetter(e *entry, now time.Time) {
	err := c.log.DeadLetter(DeadLetter{
		Group:         c.cfg.Group,
		Message:       e.msg,
		Attempts:      e.attempts,
		Reason:        e.lastReason,
		FirstDelivery: e.firstDelivery,
		LastDelivery:  e.lastDelivery,
		DeadAt:        now,
	})
	if err != nil {
		c.st.storeErrors++
		c.logger.Error("keyshared: cannot record dead letter, will retry", "offset", e.msg.Offset, "key", e.msg.Key, "error", err)
		if e.state != entryDLQPending {
			e.state = entryDLQPending
			c.w.markKey(e.ks)
		}
		c.dlqPending = append(c.dlqPending, e)
		return
	}
	c.finish(e, outDeadLettered, now)
}

// retryDeadLetters retries dead letters the store failed to record.
func (c *core) retryDeadLetters(now time.Time) {
	if len(c.dlqPending) == 0 {
		return
	}
	pending := c.dlqPending
	c.dlqPending = nil
	for _, e := range pending {
		c.deadLetter(e, now)
	}
}
