package ops

import (
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// maxGroupLabel bounds the group label: a group name may be 32 KiB long, and
// it is repeated on every per-group metric of every scrape.
const maxGroupLabel = 200

// groupLabel is a group's metrics label: its name, or for a long one its
// first bytes and a hash of the whole (still unique in practice). Clients
// choose share names and filters: control characters and bytes that are not
// UTF-8 are written as \xNN (with the hash, so that no two names share a
// label), so that no raw escape sequence reaches a terminal or a dashboard
// that shows the scrape (Prometheus' format escapes only \, " and newline).
func groupLabel(name string) string {
	clean := labelSafe(name)
	if len(clean) <= maxGroupLabel && clean == name {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	cut := min(len(clean), maxGroupLabel-20)
	for cut > 0 && cut < len(clean) && clean[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return fmt.Sprintf("%s...%016x", clean[:cut], h.Sum64())
}

// labelSafe returns s with control characters and invalid UTF-8 written as \xNN.
func labelSafe(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		bad := (r == utf8.RuneError && size == 1) || r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0)
		if bad && b.Len() == 0 {
			b.WriteString(s[:i])
		}
		switch {
		case bad:
			for _, c := range []byte(s[i : i+size]) {
				fmt.Fprintf(&b, "\\x%02x", c)
			}
		case b.Len() > 0:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	if b.Len() == 0 {
		return s
	}
	return b.String()
}

// groupsCollector exposes every Key-Shared group's figures at scrape time,
// labelled group="<share>/<filter>", from the same views as the admin API.
// Counters count since the group's dispatcher started (broker start or group
// creation); Prometheus' rate() handles the resets.
type groupsCollector struct {
	a            *groupAdmin
	metrics      []groupMetric
	appendErrors *prometheus.Desc
	keysTooLong  *prometheus.Desc
	refused      *prometheus.Desc
	dropped      *prometheus.Desc
}

type groupMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(*adminapi.GroupView) float64
}

func newGroupsCollector(a *groupAdmin) *groupsCollector {
	c := &groupsCollector{a: a, appendErrors: prometheus.NewDesc("keyline_keyshared_append_errors_total",
		"QoS 1/2 publishes a group log refused (backlog full or store error); the publisher was not acknowledged.", nil, nil),
		keysTooLong: prometheus.NewDesc("keyline_keyshared_keys_too_long_total",
			"Publishes refused because their routing key exceeded max-key-size.", nil, nil),
		refused: prometheus.NewDesc("keyline_keyshared_subscriptions_refused_total",
			"Shared subscriptions refused at max-groups or max-groups-per-client.", nil, nil),
		dropped: prometheus.NewDesc("keyline_keyshared_results_dropped_total",
			"Member acks, nacks and rejects that reached a closed group (broker stopping, group deleted); those messages are delivered again.", nil, nil)}
	gauge := func(name, help string, f func(*adminapi.GroupView) float64) {
		c.metrics = append(c.metrics, groupMetric{prometheus.NewDesc(name, help, []string{"group"}, nil), prometheus.GaugeValue, f})
	}
	counter := func(name, help string, f func(*adminapi.GroupView) uint64) {
		c.metrics = append(c.metrics, groupMetric{prometheus.NewDesc(name, help, []string{"group"}, nil), prometheus.CounterValue,
			func(v *adminapi.GroupView) float64 { return float64(f(v)) }})
	}
	gauge("keyline_group_backlog", "Messages after the group's cursor, not resolved yet.", func(v *adminapi.GroupView) float64 { return float64(v.Backlog) })
	gauge("keyline_group_lag", "Messages of the group's log not yet read into its window.", func(v *adminapi.GroupView) float64 { return float64(v.Lag) })
	gauge("keyline_group_log_head", "Offset of the last message appended to the group's log.", func(v *adminapi.GroupView) float64 { return float64(v.Head) })
	gauge("keyline_group_cursor", "The group's cursor: every offset up to it is resolved.", func(v *adminapi.GroupView) float64 { return float64(v.Cursor) })
	gauge("keyline_group_inflight", "Messages delivered to members and awaiting their ack.", func(v *adminapi.GroupView) float64 { return float64(v.InFlight) })
	gauge("keyline_group_blocked", "Messages in the group's window not in flight (behind their key, awaiting a retry or a member with room).", func(v *adminapi.GroupView) float64 { return float64(v.Blocked) })
	gauge("keyline_group_blocked_keys", "Keys with messages in the window but none in flight.", func(v *adminapi.GroupView) float64 { return float64(v.BlockedKeys) })
	gauge("keyline_group_unroutable_keys", "Keys whose next message no member may take (key filters, read access); they wait for one that may.", func(v *adminapi.GroupView) float64 { return float64(v.UnroutableKeys) })
	gauge("keyline_group_window_bytes", "Size of the group's messages read into memory.", func(v *adminapi.GroupView) float64 { return float64(v.WindowBytes) })
	gauge("keyline_group_poisoned_keys", "Keys stopped by the block poison policy.", func(v *adminapi.GroupView) float64 { return float64(v.PoisonedKeys) })
	gauge("keyline_group_members", "Members subscribed to the group.", func(v *adminapi.GroupView) float64 { return float64(len(v.Members)) })
	gauge("keyline_group_members_at_limit", "Members with as many messages in flight as they may hold.", func(v *adminapi.GroupView) float64 { return float64(v.MembersAtLimit) })
	gauge("keyline_group_dead_letters", "Dead letters the group holds now.", func(v *adminapi.GroupView) float64 { return float64(v.DeadLetters) })
	counter("keyline_group_delivered_total", "Deliveries to members, first ones and retries.", func(v *adminapi.GroupView) uint64 { return v.Counters.Delivered })
	counter("keyline_group_redeliveries_total", "Deliveries after the first of the same message.", func(v *adminapi.GroupView) uint64 { return v.Counters.Redeliveries })
	counter("keyline_group_acks_total", "Messages members acknowledged.", func(v *adminapi.GroupView) uint64 { return v.Counters.Acked })
	counter("keyline_group_nacks_total", "Negative acks asking for a retry.", func(v *adminapi.GroupView) uint64 { return v.Counters.Nacks })
	counter("keyline_group_rejects_total", "Negative acks with a never-retry reason code (0x87, 0x99).", func(v *adminapi.GroupView) uint64 { return v.Counters.Rejects })
	counter("keyline_group_ack_timeouts_total", "Deliveries whose ack timed out.", func(v *adminapi.GroupView) uint64 { return v.Counters.Timeouts })
	counter("keyline_group_member_losses_total", "In-flight messages requeued because their member left.", func(v *adminapi.GroupView) uint64 { return v.Counters.MemberLosses })
	counter("keyline_group_dead_lettered_total", "Messages dead-lettered.", func(v *adminapi.GroupView) uint64 { return v.Counters.DeadLettered })
	counter("keyline_group_dropped_total", "Messages dropped by the drop poison policy.", func(v *adminapi.GroupView) uint64 { return v.Counters.Dropped })
	counter("keyline_group_expired_total", "Messages skipped because their message expiry passed.", func(v *adminapi.GroupView) uint64 { return v.Counters.Expired })
	counter("keyline_group_evictions_total", "Members evicted after staying disconnected.", func(v *adminapi.GroupView) uint64 { return v.Counters.Evictions })
	counter("keyline_group_backlog_dropped_total", "Unresolved messages dropped by the drop-oldest backlog policy.", func(v *adminapi.GroupView) uint64 { return v.BacklogDropped })
	counter("keyline_group_backlog_rejected_total", "Publishes refused because the group's backlog was full.", func(v *adminapi.GroupView) uint64 { return v.BacklogRejected })
	counter("keyline_group_store_errors_total", "Failed log reads, cursor saves and dead-letter writes.", func(v *adminapi.GroupView) uint64 { return v.Counters.StoreErrors })
	counter("keyline_group_qos0_routed_total", "QoS 0 messages routed to a member.", func(v *adminapi.GroupView) uint64 { return v.QoS0.Routed })
	counter("keyline_group_qos0_dropped_total", "QoS 0 messages dropped because the member's queue had no room.", func(v *adminapi.GroupView) uint64 { return v.QoS0.Dropped })
	counter("keyline_group_qos0_skipped_total", "QoS 0 messages no member could take.", func(v *adminapi.GroupView) uint64 { return v.QoS0.Skipped })
	return c
}

func (c *groupsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.appendErrors
	ch <- c.keysTooLong
	ch <- c.refused
	ch <- c.dropped
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

func (c *groupsCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.a.s.b.Figures()
	ch <- prometheus.MustNewConstMetric(c.appendErrors, prometheus.CounterValue, float64(f.GroupAppendErrors))
	ch <- prometheus.MustNewConstMetric(c.keysTooLong, prometheus.CounterValue, float64(f.GroupKeysTooLong))
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(f.GroupSubscriptionsRefused))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(f.GroupResultsDropped))
	views, err := c.a.groupViews()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.metrics[0].desc, err)
		return
	}
	for i := range views {
		v := &views[i]
		label := groupLabel(v.Name)
		for _, m := range c.metrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(v), label)
		}
	}
}
