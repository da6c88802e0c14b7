package broker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyline-mq/keyline/bridge"
	"github.com/keyline-mq/keyline/internal/adminapi"
)

// BridgeViews returns what the admin API shows of every bridge, in
// configuration order.
func (b *Broker) BridgeViews() []adminapi.BridgeView {
	out := []adminapi.BridgeView{}
	if b.bridges == nil {
		return out
	}
	for i, st := range b.bridges.Statuses() {
		out = append(out, bridgeView(&b.cfg.Bridges[i], st))
	}
	return out
}

func bridgeView(c *BridgeConfig, st bridge.Status) adminapi.BridgeView {
	v := adminapi.BridgeView{
		Name: st.Name, State: st.State, Address: st.Address, Subscribed: st.Subscribed,
		Addresses: c.Addresses, ClientID: st.ClientID, Protocol: "3.1.1", Node: st.Node, Groups: st.Groups,
		QueuedMessages: st.QueuedMessages, QueuedBytes: st.QueuedBytes, InFlight: st.InFlight,
		Sent: st.Sent, Received: st.Received, Dropped: st.Dropped, Looped: st.Looped, Nacked: st.Nacked,
		Refused: st.Refused, DeadLetters: st.DeadLetters, Connects: st.Connects, Failures: st.Failures,
		LastError: st.LastError, Topics: []string{},
	}
	if st.Protocol == bridge.MQTT5 {
		v.Protocol = "5"
	}
	if v.Groups == nil {
		v.Groups = []string{}
	}
	for _, t := range c.Topics {
		v.Topics = append(v.Topics, t.Rule.String())
	}
	if !st.ConnectedAt.IsZero() {
		v.ConnectedAt = timePtr(st.ConnectedAt)
	}
	if !st.LastErrorAt.IsZero() {
		v.LastErrorAt = timePtr(st.LastErrorAt)
	}
	return v
}

func timePtr(t time.Time) *time.Time { return &t }

// bridgeCollector exports every bridge's figures, labelled by bridge.
type bridgeCollector struct{ b *Broker }

var bridgeMetrics = []struct {
	name, help string
	kind       prometheus.ValueType
	value      func(*bridge.Status) float64
}{
	{"keyline_bridge_connected", "1 while the bridge is connected to its remote (on this node).", prometheus.GaugeValue, func(s *bridge.Status) float64 {
		if s.State == "connected" {
			return 1
		}
		return 0
	}},
	{"keyline_bridge_queued_messages", "Outbound messages waiting for the remote.", prometheus.GaugeValue, func(s *bridge.Status) float64 { return float64(s.QueuedMessages) }},
	{"keyline_bridge_queued_bytes", "Bytes the bridge's outbound logs hold.", prometheus.GaugeValue, func(s *bridge.Status) float64 { return float64(s.QueuedBytes) }},
	{"keyline_bridge_inflight_messages", "Publishes awaiting the remote's acknowledgement.", prometheus.GaugeValue, func(s *bridge.Status) float64 { return float64(s.InFlight) }},
	{"keyline_bridge_sent_total", "Messages the remote acknowledged (or sent at QoS 0).", prometheus.CounterValue, func(s *bridge.Status) float64 { return float64(s.Sent) }},
	{"keyline_bridge_received_total", "Messages brought in from the remote and published here.", prometheus.CounterValue, func(s *bridge.Status) float64 { return float64(s.Received) }},
	{"keyline_bridge_dropped_total", "Messages that did not cross (looped, QoS 0 without a connection, backlog limit, no rule).", prometheus.CounterValue, func(s *bridge.Status) float64 { return float64(s.Dropped) }},
	{"keyline_bridge_looped_total", "Messages not sent because they had left this broker already (loop prevention).", prometheus.CounterValue, func(s *bridge.Status) float64 { return float64(s.Looped) }},
	{"keyline_bridge_nacked_total", "Publishes the remote refused with a reason code.", prometheus.CounterValue, func(s *bridge.Status) float64 { return float64(s.Nacked) }},
	{"keyline_bridge_dead_letters", "Messages the remote refused for good, kept as dead letters.", prometheus.GaugeValue, func(s *bridge.Status) float64 { return float64(s.DeadLetters) }},
	{"keyline_bridge_connects_total", "Connections made to the remote.", prometheus.CounterValue, func(s *bridge.Status) float64 { return float64(s.Connects) }},
	{"keyline_bridge_connect_failures_total", "Connection attempts that failed.", prometheus.CounterValue, func(s *bridge.Status) float64 { return float64(s.Failures) }},
}

func (c bridgeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range bridgeMetrics {
		ch <- prometheus.NewDesc(m.name, m.help, []string{"bridge"}, nil)
	}
}

func (c bridgeCollector) Collect(ch chan<- prometheus.Metric) {
	if c.b.bridges == nil {
		return
	}
	for _, st := range c.b.bridges.Statuses() {
		for _, m := range bridgeMetrics {
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(m.name, m.help, []string{"bridge"}, nil), m.kind, m.value(&st), st.Name)
		}
	}
}
