package broker

import (
	"fmt"
	"strings"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
)

// merge returns s with o's set (non-zero) fields over it.
func (s GroupSettings) merge(o GroupSettings) GroupSettings {
	if o.AckTimeout != 0 {
		s.AckTimeout = o.AckTimeout
	}
	if o.MaxDeliveries != 0 {
		s.MaxDeliveries = o.MaxDeliveries
	}
	if o.PoisonPolicy != 0 {
		s.PoisonPolicy = o.PoisonPolicy
	}
	if len(o.RetryBackoff) > 0 {
		s.RetryBackoff = o.RetryBackoff
	}
	if o.MemberMaxInflight != 0 {
		s.MemberMaxInflight = o.MemberMaxInflight
	}
	if o.Window != 0 {
		s.Window = o.Window
	}
	if o.WindowBytes != 0 {
		s.WindowBytes = o.WindowBytes
	}
	if o.BacklogMaxMessages != 0 {
		s.BacklogMaxMessages = o.BacklogMaxMessages
	}
	if o.BacklogMaxBytes != 0 {
		s.BacklogMaxBytes = o.BacklogMaxBytes
	}
	if o.BacklogPolicy != 0 {
		s.BacklogPolicy = o.BacklogPolicy
	}
	return s
}

// settingsFor returns the settings of group name ("<share>/<filter>"): the
// global ones with the first matching override over them.
func (c *Config) settingsFor(name string) GroupSettings {
	share, _, _ := strings.Cut(name, "/")
	for _, o := range c.GroupOverrides {
		if (o.Group != "" && o.Group == name) || (o.Share != "" && o.Share == share) {
			return c.GroupSettings.merge(o.GroupSettings)
		}
	}
	return c.GroupSettings
}

// groupSettings resolves group name's dispatcher and storage settings.
func (c *Config) groupSettings(name string) (keyshared.Config, keyshared.GroupConfig, error) {
	s := c.settingsFor(name)
	bad := func(format string, a ...any) (keyshared.Config, keyshared.GroupConfig, error) {
		return keyshared.Config{}, keyshared.GroupConfig{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case s.PoisonPolicy == 0:
		return bad("poison-policy is not set (want %s)", keyshared.PoisonPolicies)
	case s.BacklogPolicy == 0:
		return bad("backlog-policy is not set (want %s)", keyshared.BacklogPolicies)
	case s.AckTimeout <= 0:
		return bad("ack-timeout must be positive")
	case s.MaxDeliveries < 1:
		return bad("max-deliveries must be at least 1")
	case len(s.RetryBackoff) == 0 || len(s.RetryBackoff) > 2 || s.RetryBackoff[0] <= 0:
		return bad("retry-backoff must be a positive base delay, optionally followed by a maximum (e.g. 1s,1m)")
	case len(s.RetryBackoff) == 2 && s.RetryBackoff[1] < s.RetryBackoff[0]:
		return bad("retry-backoff maximum %v is below its base %v", s.RetryBackoff[1], s.RetryBackoff[0])
	case s.MemberMaxInflight < 1 || s.MemberMaxInflight > 65535:
		return bad("member-max-inflight must be between 1 and 65535")
	case s.Window < 1:
		return bad("window must be at least 1")
	case s.WindowBytes < 1:
		return bad("window-bytes must be at least 1")
	case s.BacklogMaxBytes < 0:
		return bad("backlog-max-bytes must not be negative")
	}
	d := keyshared.DefaultConfig()
	d.Group = name
	d.AckTimeout, d.MaxDeliveries, d.Poison = s.AckTimeout, s.MaxDeliveries, s.PoisonPolicy
	d.RetryBackoffBase, d.RetryBackoffMax = s.RetryBackoff[0], s.RetryBackoff[0]
	if len(s.RetryBackoff) == 2 {
		d.RetryBackoffMax = s.RetryBackoff[1]
	}
	d.MemberMaxInflight, d.Window, d.WindowBytes = s.MemberMaxInflight, s.Window, int64(s.WindowBytes)
	if err := d.Validate(); err != nil {
		return bad("%v", err)
	}
	g := keyshared.GroupConfig{MaxMessages: s.BacklogMaxMessages, MaxBytes: uint64(s.BacklogMaxBytes), Policy: s.BacklogPolicy}
	if err := g.Validate(); err != nil {
		return bad("%v", err)
	}
	return d, g, nil
}

// sweepInterval is how often idle groups are looked for.
func sweepInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/4, time.Second), time.Minute)
}
