package broker

import (
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyline-mq/keyline/hooks"
)

// RateLimitConfig are the rate limits (hooks.RateLimits); 0 is no limit,
// and all are off by default. A reload applies them.
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
}

func (c *RateLimitConfig) validate() error {
	for _, r := range []struct {
		name string
		v    float64
	}{{"connect-rate-per-listener", c.ConnectRatePerListener}, {"connect-rate-per-address", c.ConnectRatePerAddress},
		{"client-messages-rate", c.ClientMessagesRate}, {"client-bytes-rate", float64(c.ClientBytesRate)}} {
		if r.v < 0 || math.IsNaN(r.v) || math.IsInf(r.v, 0) || r.v > 1e9 {
			return fmt.Errorf("%w: %s %v is not a rate per second between 0 (no limit) and 1e9", ErrInvalidConfig, r.name, r.v)
		}
	}
	return nil
}

func (c *RateLimitConfig) settings() hooks.RateSettings {
	return hooks.RateSettings{ConnectPerListener: c.ConnectRatePerListener, ConnectPerAddress: c.ConnectRatePerAddress,
		MessagesPerClient: c.ClientMessagesRate, BytesPerClient: float64(c.ClientBytesRate)}
}

// rateCollector exports what the rate limits did.
type rateCollector struct{ b *Broker }

var (
	connectRefusedDesc = prometheus.NewDesc("keyline_connects_rate_limited_total",
		"CONNECTs refused (0x9F, 3.1.1: 0x03) past connect-rate-per-listener or connect-rate-per-address, by scope.", []string{"scope"}, nil)
	throttledDesc = prometheus.NewDesc("keyline_client_throttled_total",
		"Times a connection was not read for a moment because it sent past client-messages-rate or client-bytes-rate.", nil, nil)
	throttledSecondsDesc = prometheus.NewDesc("keyline_client_throttled_seconds_total",
		"Time connections were not read because of client-messages-rate or client-bytes-rate.", nil, nil)
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
	ch <- prometheus.MustNewConstMetric(throttledDesc, prometheus.CounterValue, float64(r.Throttled.Load()))
	ch <- prometheus.MustNewConstMetric(throttledSecondsDesc, prometheus.CounterValue, float64(r.ThrottledNanos.Load())/1e9)
}
