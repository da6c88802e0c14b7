package ops

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// brokerCollector exposes the broker's figures at scrape time: nothing is
// added to the publish path.
type brokerCollector struct {
	s     *Service
	descs map[string]*prometheus.Desc
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
	{"keyline_inflight_dropped_total", "QoS 1/2 messages dropped because a session held max-inflight messages or max-session-queue-bytes, all sessions max-queued-bytes, or it ran out of packet ids.", prometheus.CounterValue},
	{"keyline_packets_received_total", "MQTT packets received.", prometheus.CounterValue},
	{"keyline_packets_sent_total", "MQTT packets sent.", prometheus.CounterValue},
	{"keyline_bytes_received_total", "Bytes received from MQTT clients.", prometheus.CounterValue},
	{"keyline_bytes_sent_total", "Bytes sent to MQTT clients.", prometheus.CounterValue},
	{"keyline_retained_messages", "Retained messages held.", prometheus.GaugeValue},
	{"keyline_inflight_messages", "QoS 1/2 messages in flight or queued for sessions.", prometheus.GaugeValue},
	{"keyline_subscriptions", "Subscriptions held.", prometheus.GaugeValue},
	{"keyline_uptime_seconds", "Seconds since the broker started.", prometheus.GaugeValue},
	{"keyline_ready", "1 while /readyz answers 200 (serving MQTT, and in cluster mode connected to NATS), else 0.", prometheus.GaugeValue},
	{"keyline_session_store_commits_total", "Session-state transactions committed to the data file.", prometheus.CounterValue},
	{"keyline_session_store_write_errors_total", "Session-state writes lost to a failed commit.", prometheus.CounterValue},
	{"keyline_fanout_deliveries_total", "QoS 0 deliveries queued by the encode-once fan-out path.", prometheus.CounterValue},
	{"keyline_fanout_encodes_total", "PUBLISH frames encoded by the fan-out path (one per message and frame variant).", prometheus.CounterValue},
	{"keyline_fanout_too_large_total", "Fan-out deliveries skipped because the frame exceeded the client's maximum packet size.", prometheus.CounterValue},
	{"keyline_fanout_tracked_total", "QoS 1/2 deliveries queued in session outboxes by the encode-once fan-out path.", prometheus.CounterValue},
	{"keyline_outbox_resent_total", "QoS 1/2 messages sent again (DUP) after a client reconnected.", prometheus.CounterValue},
	{"keyline_outbox_expired_total", "Queued QoS 1/2 messages dropped unsent because their expiry (or max-message-expiry) passed.", prometheus.CounterValue},
	{"keyline_outbox_queued_bytes", "Bytes of QoS 1/2 messages held for sessions, queued or unacknowledged (bounded by max-queued-bytes).", prometheus.GaugeValue},
	{"keyline_outbox_cold_bytes", "Of keyline_outbox_queued_bytes, the bytes of persistent sessions' messages whose frames are in the data file only (restored at start, or held past spill-after) until they are sent.", prometheus.GaugeValue},
	{"keyline_outbox_spilled_bytes", "Of keyline_outbox_queued_bytes, the bytes of clean sessions' messages waiting in data-dir/spill for clients that do not read (spill-after).", prometheus.GaugeValue},
	{"keyline_outbox_spilled_total", "QoS 1/2 messages whose frames waited in data-dir/spill.", prometheus.CounterValue},
	{"keyline_group_log_commits_total", "Commits of the Key-Shared groups' segment log (one write each and, with fsync, one fdatasync; not in cluster mode).", prometheus.CounterValue},
	{"keyline_group_log_syncs_total", "fdatasyncs of the Key-Shared groups' segment log.", prometheus.CounterValue},
	{"keyline_group_log_appends_total", "Messages appended to the Key-Shared groups' segment log; divided by keyline_group_log_commits_total, the appends a commit carries.", prometheus.CounterValue},
	{"keyline_group_log_commit_waits_total", "Commits of the segment log held back (at most commit-interval) for more appends to carry.", prometheus.CounterValue},
	{"keyline_group_log_sparse_commits_total", "Commits of the segment log not held back because publishes came more than half a commit's time apart.", prometheus.CounterValue},
	{"keyline_group_log_resolve_commits_total", "Of keyline_group_log_commits_total, the commits that carried only resolutions (acks and the like), which no append commit took within the resolve delay.", prometheus.CounterValue},
	{"keyline_group_log_write_seconds_total", "Time the segment log's commits spent in their write and fdatasync; divided by keyline_group_log_commits_total, the commit latency the disk gives under the broker's load (the fsync bound of a publisher with N in flight is N divided by it).", prometheus.CounterValue},
	{"keyline_outbox_store_refused_total", "QoS 1/2 publishes refused because a persistent session's record of the message could not be stored.", prometheus.CounterValue},
	{"keyline_wills_refused_total", "CONNECTs refused (0x87) for a will the client may not publish (the ACL, or a reserved topic).", prometheus.CounterValue},
	{"keyline_reserved_publishes_refused_total", "Publishes into $dlq/, $share/ or $SYS/ refused (QoS 1/2 answered 0x87 or disconnected, QoS 0 dropped).", prometheus.CounterValue},
	{"keyline_client_id_takeovers_refused_total", "CONNECTs refused because the client id's session belongs to another user.", prometheus.CounterValue},
	{"keyline_conn_dropped_messages_total", "QoS 0 messages dropped by a slow client's overflow policy.", prometheus.CounterValue},
	{"keyline_conn_dropped_bytes_total", "Bytes of QoS 0 messages dropped by a slow client's overflow policy.", prometheus.CounterValue},
	{"keyline_conn_conflated_messages_total", "QoS 0 messages replaced in a slow client's queue by a newer one of their topic (slow policy conflate).", prometheus.CounterValue},
	{"keyline_conn_drop_signals_total", "Drop signals sent: publishes that carried the number of messages their client missed.", prometheus.CounterValue},
	{"keyline_conn_slow_disconnects_total", "Clients disconnected because their outbound queue overflowed.", prometheus.CounterValue},
	{"keyline_conn_abandoned_acks_total", "Acknowledgements held on a durable write and not sent: the connection closed and the write was still undecided after connq.HoldCloseTimeout (the publisher resends).", prometheus.CounterValue},
	{"keyline_conn_protocol_errors_total", "Connections closed for a protocol error found in what the client sent (duplicate properties, Receive Maximum or Maximum Packet Size 0).", prometheus.CounterValue},
	{"keyline_conn_writes_total", "Socket writes (one writev per writer wakeup).", prometheus.CounterValue},
	{"keyline_conn_frames_written_total", "MQTT frames written; divided by keyline_conn_writes_total, the frames per writev.", prometheus.CounterValue},
	{"keyline_conn_queued_bytes", "Bytes waiting in connected clients' outbound queues.", prometheus.GaugeValue},
	{"keyline_poller_events_total", "Readiness events of plain TCP connections taken from the poller's epoll.", prometheus.CounterValue},
	{"keyline_poller_runs_total", "Connection handler runs (reads of what arrived, fed to the MQTT layer).", prometheus.CounterValue},
	{"keyline_poller_reads_total", "read(2) calls on plain TCP connections.", prometheus.CounterValue},
	{"keyline_poller_waiters_started_total", "Waiters started beside a connection handler not yet proven quick (a CONNECT, or the run after a slow one), or because every waiter was busy.", prometheus.CounterValue},
	{"keyline_poller_rescues_total", "Waiters the poller's watchdog started because a handler proven quick blocked with no waiter left: other connections' events waited meanwhile.", prometheus.CounterValue},
}

func newBrokerCollector(s *Service) *brokerCollector {
	c := &brokerCollector{s: s, descs: map[string]*prometheus.Desc{}}
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
	f := c.s.b.Figures()
	values := map[string]float64{"keyline_uptime_seconds": time.Since(c.s.started).Seconds(), "keyline_ready": 0}
	if c.s.b.NotReady() == nil {
		values["keyline_ready"] = 1
	}
	values["keyline_clients_connected"] = float64(f.ClientsConnected)
	values["keyline_clients_disconnected"] = float64(f.Sessions - f.ClientsConnected)
	values["keyline_clients_maximum"] = float64(f.ClientsMaximum)
	values["keyline_messages_received_total"] = float64(f.MessagesReceived)
	values["keyline_messages_sent_total"] = float64(f.MessagesSent)
	values["keyline_messages_dropped_total"] = float64(f.MessagesDropped)
	values["keyline_inflight_dropped_total"] = float64(f.InflightDropped)
	values["keyline_packets_received_total"] = float64(f.PacketsReceived)
	values["keyline_packets_sent_total"] = float64(f.PacketsSent)
	values["keyline_bytes_received_total"] = float64(f.BytesReceived)
	values["keyline_bytes_sent_total"] = float64(f.BytesSent)
	values["keyline_retained_messages"] = float64(f.Retained)
	values["keyline_inflight_messages"] = float64(f.Inflight)
	values["keyline_subscriptions"] = float64(f.Subscriptions)
	values["keyline_session_store_commits_total"] = float64(f.SessionCommits)
	values["keyline_session_store_write_errors_total"] = float64(f.SessionWriteErrors)
	values["keyline_fanout_deliveries_total"] = float64(f.FanoutDeliveries)
	values["keyline_fanout_encodes_total"] = float64(f.FanoutEncodes)
	values["keyline_fanout_too_large_total"] = float64(f.FanoutTooLarge)
	values["keyline_fanout_tracked_total"] = float64(f.FanoutTracked)
	values["keyline_outbox_resent_total"] = float64(f.OutboxResent)
	values["keyline_outbox_expired_total"] = float64(f.OutboxExpired)
	values["keyline_outbox_queued_bytes"] = float64(f.OutboxQueuedBytes)
	values["keyline_outbox_cold_bytes"] = float64(f.OutboxColdBytes)
	values["keyline_outbox_spilled_bytes"] = float64(f.OutboxSpilledBytes)
	values["keyline_outbox_spilled_total"] = float64(f.OutboxSpilled)
	values["keyline_group_log_commits_total"] = float64(f.LogCommits)
	values["keyline_group_log_syncs_total"] = float64(f.LogSyncs)
	values["keyline_group_log_appends_total"] = float64(f.LogAppends)
	values["keyline_group_log_commit_waits_total"] = float64(f.LogCommitWaits)
	values["keyline_group_log_sparse_commits_total"] = float64(f.LogSparseCommits)
	values["keyline_group_log_resolve_commits_total"] = float64(f.LogResolveCommits)
	values["keyline_group_log_write_seconds_total"] = f.LogWriteTime.Seconds()
	values["keyline_outbox_store_refused_total"] = float64(f.OutboxStoreRefused)
	values["keyline_reserved_publishes_refused_total"] = float64(f.ReservedRefused)
	values["keyline_wills_refused_total"] = float64(f.WillsRefused)
	values["keyline_client_id_takeovers_refused_total"] = float64(f.TakeoversRefused)
	values["keyline_conn_dropped_messages_total"] = float64(f.ConnDroppedMessages)
	values["keyline_conn_dropped_bytes_total"] = float64(f.ConnDroppedBytes)
	values["keyline_conn_conflated_messages_total"] = float64(f.ConnConflated)
	values["keyline_conn_drop_signals_total"] = float64(f.ConnDropSignals)
	values["keyline_conn_slow_disconnects_total"] = float64(f.ConnSlowDisconnects)
	values["keyline_conn_abandoned_acks_total"] = float64(f.ConnAbandonedHolds)
	values["keyline_conn_protocol_errors_total"] = float64(f.ConnProtocolErrors)
	values["keyline_conn_writes_total"] = float64(f.ConnWrites)
	values["keyline_conn_frames_written_total"] = float64(f.ConnFrames)
	values["keyline_poller_events_total"] = float64(f.PollerEvents)
	values["keyline_poller_runs_total"] = float64(f.PollerRuns)
	values["keyline_poller_reads_total"] = float64(f.PollerReads)
	values["keyline_poller_waiters_started_total"] = float64(f.PollerWaitersStarted)
	values["keyline_poller_rescues_total"] = float64(f.PollerRescues)
	queued := 0
	for _, v := range c.s.b.Clients() {
		queued += v.QueuedBytes
	}
	values["keyline_conn_queued_bytes"] = float64(queued)
	for _, m := range brokerMetrics {
		if v, ok := values[m.name]; ok {
			ch <- prometheus.MustNewConstMetric(c.descs[m.name], m.kind, v)
		}
	}
}

func newRegistry(cs ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(cs...)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}
