package broker

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyline-mq/keyline/hooks"
)

// RateLimitConfig are the rate limits (hooks.RateLimits); 0 is no limit,
// and all but connect-rate-per-address are off by default. A reload
// applies them.
type RateLimitConfig struct {
	// ConnectRatePerListener and ConnectRatePerAddress bound CONNECTs per
	// second on each listener and from each source address; past them a
	// CONNECT gets 0x9F (3.1.1: 0x03).
	ConnectRatePerListener float64 `yaml:"connect-rate-per-listener"`
	ConnectRatePerAddress  float64 `yaml:"connect-rate-per-address"`
	// ClientMessagesRate and ClientBytesRate bound the PUBLISH messages and
	// bytes per second one connection sends; past them the broker stops
	// reading it for a moment.
	ClientMessagesRate float64  `yaml:"client-messages-rate"`
	ClientBytesRate    ByteSize `yaml:"client-bytes-rate"`
	// UserRateLimits are rates per authenticated user (its certificate's
	// identity, its token's user, or its user name), one bucket for all the
	// user's connections. Config file only.
	UserRateLimits map[string]UserRateLimit `yaml:"user-rate-limits"`
}

// DefaultConnectRatePerAddress is the default connect-rate-per-address,
// whose bucket holds ten seconds' worth (1,000 CONNECTs at once). It is
// 360,000 connections an hour from one address: a fleet behind one NAT
// address that reconnects at its ordinary churn stays far below it (100,000
// devices reconnecting once an hour make 28 a second), and after a broker
// restart its first 1,000 devices are back at once and the rest at 100 a
// second, each refused one retrying on its back-off. Past ten seconds above
// 100 a second, one address is a client reconnecting in a loop without
// back-off (or cycling client ids), which a tight loop over a LAN does at
// thousands a second: it is held to 100, each refused before its password
// is hashed.
const DefaultConnectRatePerAddress = 100

// UserRateLimit is one user's rates, per second; 0: no limit.
type UserRateLimit struct {
	// MessagesRate and BytesRate bound the PUBLISH messages and bytes per
	// second the user's connections send together.
	MessagesRate float64  `yaml:"messages-rate"`
	BytesRate    ByteSize `yaml:"bytes-rate"`
	// ConnectRate bounds the user's CONNECTs per second, counted once they
	// authenticated; past it, 0x9F (3.1.1: 0x03).
	ConnectRate float64 `yaml:"connect-rate"`
}

type namedRate struct {
	name string
	v    float64
}

// validate checks the rates; authRequired: clients authenticate (user
// rate limits need it: without, a user name is whatever a client says).
func (c *RateLimitConfig) validate(authRequired bool) error {
	rates := []namedRate{{"connect-rate-per-listener", c.ConnectRatePerListener}, {"connect-rate-per-address", c.ConnectRatePerAddress},
		{"client-messages-rate", c.ClientMessagesRate}, {"client-bytes-rate", float64(c.ClientBytesRate)}}
	if len(c.UserRateLimits) > 0 && !authRequired {
		return fmt.Errorf("%w: user-rate-limits needs authentication (auth users, password-file, jwt-key or tls-identity)", ErrInvalidConfig)
	}
	for _, u := range slices.Sorted(maps.Keys(c.UserRateLimits)) {
		if u == "" {
			return fmt.Errorf("%w: user-rate-limits has an empty user name", ErrInvalidConfig)
		}
		l := c.UserRateLimits[u]
		rates = append(rates, namedRate{"user-rate-limits " + u + " messages-rate", l.MessagesRate},
			namedRate{"user-rate-limits " + u + " bytes-rate", float64(l.BytesRate)},
			namedRate{"user-rate-limits " + u + " connect-rate", l.ConnectRate})
	}
	for _, r := range rates {
		if r.v < 0 || math.IsNaN(r.v) || math.IsInf(r.v, 0) || r.v > 1e9 {
			return fmt.Errorf("%w: %s %v is not a rate per second between 0 (no limit) and 1e9", ErrInvalidConfig, r.name, r.v)
		}
	}
	return nil
}

func (c *RateLimitConfig) settings() hooks.RateSettings {
	s := hooks.RateSettings{ConnectPerListener: c.ConnectRatePerListener, ConnectPerAddress: c.ConnectRatePerAddress,
		MessagesPerClient: c.ClientMessagesRate, BytesPerClient: float64(c.ClientBytesRate)}
	if len(c.UserRateLimits) > 0 {
		s.Users = make(map[string]hooks.UserRates, len(c.UserRateLimits))
		for u, l := range c.UserRateLimits {
			s.Users[u] = hooks.UserRates{Messages: l.MessagesRate, Bytes: float64(l.BytesRate), Connects: l.ConnectRate}
		}
	}
	return s
}

// rateCollector exports what the rate limits did.
type rateCollector struct{ b *Broker }

var (
	connectRefusedDesc = prometheus.NewDesc("keyline_connects_rate_limited_total",
		"CONNECTs refused (0x9F, 3.1.1: 0x03) past connect-rate-per-listener, connect-rate-per-address or a user's connect-rate, by scope.", []string{"scope"}, nil)
	throttledDesc = prometheus.NewDesc("keyline_client_throttled_total",
		"Times a connection was not read for a moment because it sent past client-messages-rate, client-bytes-rate or its user's rates.", nil, nil)
	throttledSecondsDesc = prometheus.NewDesc("keyline_client_throttled_seconds_total",
		"Time connections were not read because of client-messages-rate, client-bytes-rate or their user's rates.", nil, nil)
)

func (c rateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connectRefusedDesc
	ch <- throttledDesc
	ch <- throttledSecondsDesc
}

func (c rateCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.b.rates
	if r == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(connectRefusedDesc, prometheus.CounterValue, float64(r.RefusedListener.Load()), "listener")
	ch <- prometheus.MustNewConstMetric(connectRefusedDesc, prometheus.CounterValue, float64(r.RefusedAddress.Load()), "address")
	ch <- prometheus.MustNewConstMetric(connectRefusedDesc, prometheus.CounterValue, float64(r.RefusedUser.Load()), "user")
	ch <- prometheus.MustNewConstMetric(throttledDesc, prometheus.CounterValue, float64(r.Throttled.Load()))
	ch <- prometheus.MustNewConstMetric(throttledSecondsDesc, prometheus.CounterValue, float64(r.ThrottledNanos.Load())/1e9)
}
