package broker

import (
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/keyline-mq/keyline/persistence"
)

// brokerCollector exposes mochi's counters and Keyline's own at scrape time:
// nothing is added to the publish path.
type brokerCollector struct {
	info     func() *mqtt.Server
	sessions func() *persistence.SessionStore
	started  time.Time
	descs    map[string]*prometheus.Desc
}

type metricDef struct {
	name, help string
	kind       prometheus.ValueType
}

var brokerMetrics = []metricDef{
	{"keyline_clients_connected", "MQTT clients connected now.", prometheus.GaugeValue},
	{"keyline_clients_disconnected", "Persistent sessions whose client is not connected.", prometheus.GaugeValue},
	{"keyline_clients_maximum", "Most clients connected at once since start.", prometheus.GaugeValue},
	{"keyline_messages_received_total", "PUBLISH packets received from clients.", prometheus.CounterValue},
	{"keyline_messages_sent_total", "PUBLISH packets sent to clients.", prometheus.CounterValue},
	{"keyline_messages_dropped_total", "Messages dropped because a client's outbound queue was full.", prometheus.CounterValue},
	{"keyline_inflight_dropped_total", "QoS 1/2 messages dropped because a session held max-inflight messages or ran out of packet ids.", prometheus.CounterValue},
	{"keyline_packets_received_total", "MQTT packets received.", prometheus.CounterValue},
	{"keyline_packets_sent_total", "MQTT packets sent.", prometheus.CounterValue},
	{"keyline_bytes_received_total", "Bytes received from MQTT clients.", prometheus.CounterValue},
	{"keyline_bytes_sent_total", "Bytes sent to MQTT clients.", prometheus.CounterValue},
	{"keyline_retained_messages", "Retained messages held.", prometheus.GaugeValue},
	{"keyline_inflight_messages", "QoS 1/2 messages in flight or queued for sessions.", prometheus.GaugeValue},
	{"keyline_subscriptions", "Subscriptions held.", prometheus.GaugeValue},
	{"keyline_uptime_seconds", "Seconds since the broker started.", prometheus.GaugeValue},
	{"keyline_session_store_commits_total", "Session-state transactions committed to the data file.", prometheus.CounterValue},
	{"keyline_session_store_write_errors_total", "Session-state writes lost to a failed commit.", prometheus.CounterValue},
}

func newBrokerCollector(srv func() *mqtt.Server, sessions func() *persistence.SessionStore, started time.Time) *brokerCollector {
	c := &brokerCollector{info: srv, sessions: sessions, started: started, descs: map[string]*prometheus.Desc{}}
	for _, m := range brokerMetrics {
		c.descs[m.name] = prometheus.NewDesc(m.name, m.help, nil, nil)
	}
	return c
}

func (c *brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *brokerCollector) Collect(ch chan<- prometheus.Metric) {
	values := map[string]float64{"keyline_uptime_seconds": time.Since(c.started).Seconds()}
	if s := c.info(); s != nil {
		i := s.Info
		load := func(p *int64) float64 { return float64(atomic.LoadInt64(p)) }
		connected := load(&i.ClientsConnected)
		values["keyline_clients_connected"] = connected
		values["keyline_clients_disconnected"] = float64(s.Clients.Len()) - connected
		values["keyline_clients_maximum"] = load(&i.ClientsMaximum)
		values["keyline_messages_received_total"] = load(&i.MessagesReceived)
		values["keyline_messages_sent_total"] = load(&i.MessagesSent)
		values["keyline_messages_dropped_total"] = load(&i.MessagesDropped)
		values["keyline_inflight_dropped_total"] = load(&i.InflightDropped)
		values["keyline_packets_received_total"] = load(&i.PacketsReceived)
		values["keyline_packets_sent_total"] = load(&i.PacketsSent)
		values["keyline_bytes_received_total"] = load(&i.BytesReceived)
		values["keyline_bytes_sent_total"] = load(&i.BytesSent)
		values["keyline_retained_messages"] = float64(s.Topics.Retained.Len())
		values["keyline_inflight_messages"] = load(&i.Inflight)
		values["keyline_subscriptions"] = load(&i.Subscriptions)
	}
	if st := c.sessions(); st != nil {
		values["keyline_session_store_commits_total"] = float64(st.Commits())
		values["keyline_session_store_write_errors_total"] = float64(st.WriteErrors())
	}
	for _, m := range brokerMetrics {
		if v, ok := values[m.name]; ok {
			ch <- prometheus.MustNewConstMetric(c.descs[m.name], m.kind, v)
		}
	}
}

func newRegistry(c prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		c,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}
