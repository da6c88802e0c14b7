package broker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyline-mq/keyline/broker/ops"
	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/keyshared"
)

// ClusterConfig turns a node into a member of a cluster of Keyline nodes
// over NATS JetStream. Empty NATS: single-node mode (bbolt only).
type ClusterConfig struct {
	NATS          []string      `yaml:"nats"`                 // NATS server URLs; non-empty turns cluster mode on
	NodeID        string        `yaml:"node-id"`              // unique per node; empty: the host name
	NATSReplicas  int           `yaml:"nats-replicas"`        // JetStream replicas, lowered to the NATS cluster's size
	NATSCreds     string        `yaml:"nats-creds"`           // NATS credentials file
	NATSTLSCert   string        `yaml:"nats-tls-cert"`        // client certificate for NATS
	NATSTLSKey    string        `yaml:"nats-tls-key"`         // its private key
	NATSTLSCA     string        `yaml:"nats-tls-ca"`          // CA that signs the NATS servers' certificates
	QueueMaxAge   time.Duration `yaml:"nats-queue-max-age"`   // QoS 1/2 messages kept for offline sessions at most this long
	QueueMaxBytes ByteSize      `yaml:"nats-queue-max-bytes"` // and at most this many bytes, cluster-wide
	StartTimeout  time.Duration `yaml:"nats-start-timeout"`   // how long startup waits for NATS
}

// DefaultClusterConfig is the cluster part of DefaultConfig.
func DefaultClusterConfig() ClusterConfig {
	return ClusterConfig{
		NATSReplicas:  cluster.DefaultReplicas,
		QueueMaxAge:   cluster.DefaultQueueMaxAge,
		QueueMaxBytes: cluster.DefaultQueueMaxBytes,
		StartTimeout:  30 * time.Second,
	}
}

// Enabled reports whether cluster mode is on.
func (c ClusterConfig) Enabled() bool { return len(c.NATS) > 0 }

func (c ClusterConfig) validate() error {
	if !c.Enabled() {
		return nil
	}
	cc := c.clusterConfig("x")
	if err := cc.Validate(); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.TrimPrefix(strings.TrimPrefix(err.Error(), cluster.ErrConfig.Error()), ": "))
	}
	switch {
	case c.NATSReplicas < 1 || c.NATSReplicas > 5:
		return fmt.Errorf("%w: nats-replicas must be between 1 and 5", ErrInvalidConfig)
	case c.QueueMaxAge <= 0 || c.QueueMaxBytes <= 0:
		return fmt.Errorf("%w: nats-queue-max-age and nats-queue-max-bytes must be positive", ErrInvalidConfig)
	case c.StartTimeout <= 0:
		return fmt.Errorf("%w: nats-start-timeout must be positive", ErrInvalidConfig)
	}
	if c.NodeID != "" {
		cc.NodeID = c.NodeID
		if err := cc.Validate(); err != nil {
			return fmt.Errorf("%w: node-id: %v", ErrInvalidConfig, err)
		}
	}
	return nil
}

func (c ClusterConfig) clusterConfig(nodeID string) cluster.Config {
	var urls []string
	for _, u := range c.NATS {
		for _, p := range strings.Split(u, ",") {
			if p = strings.TrimSpace(p); p != "" {
				urls = append(urls, p)
			}
		}
	}
	return cluster.Config{
		URLs: urls, NodeID: nodeID, Replicas: c.NATSReplicas,
		Creds: c.NATSCreds, TLSCert: c.NATSTLSCert, TLSKey: c.NATSTLSKey, TLSCA: c.NATSTLSCA,
		QueueMaxAge: c.QueueMaxAge, QueueMaxBytes: int64(c.QueueMaxBytes),
	}
}

// nodeID is the node's id: configured, else the host name.
func (c ClusterConfig) nodeID() string {
	if c.NodeID != "" {
		return c.NodeID
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "keyline"
	}
	return host
}

// clusterMode reports whether the broker runs as a cluster node.
func (b *Broker) clusterMode() bool { return b.cfg.Cluster.Enabled() }

// keySharedHook is the Key-Shared hook as added to mochi: in cluster mode
// its groups span the nodes, and publishes from other nodes are theirs.
func (b *Broker) keySharedHook() mqtt.Hook {
	if b.be.fromCluster == nil {
		return b.keyShared
	}
	return hooks.ClusterKeyShared{KeyShared: b.keyShared, FromCluster: b.be.fromCluster}
}

// joinCluster joins the cluster and its Key-Shared groups, waiting for NATS
// and JetStream up to cfg.StartTimeout (NATS may come up after keyline, or
// with it), and makes the cluster hook.
func (b *Broker) joinCluster() error {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Cluster.StartTimeout)
	defer cancel()
	if err := b.startCluster(ctx); err != nil {
		return err // nothing of it left running
	}
	if err := b.startGroups(ctx); err != nil {
		_ = b.cluster.Stop()
		b.node.Close()
		return err
	}
	return nil
}

// startGroups joins the cluster's Key-Shared groups (after startCluster).
func (b *Broker) startGroups(ctx context.Context) error {
	g, err := b.node.StartGroups(ctx, cluster.GroupsConfig{
		Settings: b.groupSettingsOf,
		Fits:     hooks.KeySharedFits,
		OnDeadLetter: func(group string, d keyshared.DeadLetter) {
			if ks := b.clusterKS.Load(); ks != nil {
				ks.PublishDeadLetter(group, d)
			}
		},
		OnGroup: func(name string) {
			ks := b.clusterKS.Load()
			if ks == nil {
				return // the hook's Init opens every group it finds
			}
			if err := ks.OpenGroup(name); err != nil {
				b.log.Warn("cannot open a group another node created", "group", name, "error", err)
			}
		},
		Logger: b.log.With("node", b.node.NodeID()),
	})
	if err != nil {
		return fmt.Errorf("broker: join the cluster at %s: key-shared groups: %w", strings.Join(b.node.URLs(), ","), err)
	}
	b.groups = g
	return nil
}

// startCluster joins the cluster (cluster.Start waits for NATS within ctx,
// on one connection) and makes the cluster hook.
func (b *Broker) startCluster(ctx context.Context) error {
	b.cluster = hooks.NewCluster(b.server)
	b.cluster.Moved = func(id string) { b.keyShared.Forget(id) } // built after this, called once serving
	id := b.cfg.Cluster.nodeID()
	cfg := b.cfg.Cluster.clusterConfig(id)
	cfg.Logger = b.log.With("node", id)
	retained := hooks.NewClusterRetained(b.retained.Apply)
	h := b.cluster.Handler()
	h.Retained = retained.Deliver // Start applies what KL_RETAINED holds
	n, err := cluster.Start(ctx, cfg, h)
	if err != nil {
		return fmt.Errorf("broker: join the cluster at %s: %w", strings.Join(cfg.URLs, ","), err)
	}
	b.node = n
	b.cluster.SetNode(n)
	retained.SetNode(n)
	b.retained.SetStore(retained, b.cluster.FromCluster)
	return nil
}

// NodeID returns the node's id in cluster mode, "" otherwise.
func (b *Broker) NodeID() string { return b.be.nodeID }

// ClusterNode returns the cluster node (nil in single-node mode), for tests.
func (b *Broker) ClusterNode() *cluster.Node { return b.node }

// ClusterHook returns the cluster hook (nil in single-node mode), for tests.
func (b *Broker) ClusterHook() *hooks.Cluster { return b.cluster }

// clusterCollectors are the cluster's metrics.
func (b *Broker) clusterCollectors() []prometheus.Collector {
	return []prometheus.Collector{clusterCollector{b}}
}

// clusterCollector exports the cluster's counters to Prometheus.
type clusterCollector struct{ b *Broker }

var clusterMetrics = []struct {
	name, help string
	value      func(n *cluster.Node, h *hooks.Cluster) float64
}{
	{"keyline_cluster_ready", "1 while the node is connected to NATS with JetStream available.", func(n *cluster.Node, _ *hooks.Cluster) float64 {
		if n.Ready() {
			return 1
		}
		return 0
	}},
	{"keyline_cluster_forwarded_total", "Publishes sent to other nodes.", func(_ *cluster.Node, h *hooks.Cluster) float64 { return float64(h.Stats.Forwarded.Load()) }},
	{"keyline_cluster_delivered_total", "Messages from other nodes delivered locally.", func(_ *cluster.Node, h *hooks.Cluster) float64 { return float64(h.Stats.Delivered.Load()) }},
	{"keyline_cluster_core_received_total", "QoS 0 messages received from other nodes over core NATS.", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.CoreReceived.Load()) }},
	{"keyline_cluster_queued_received_total", "QoS 1/2 messages received from other nodes through the node's consumer.", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.QueuedReceived.Load()) }},
	{"keyline_cluster_queued_own_total", "The node's own QoS 1/2 messages its consumer returned (skipped).", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.QueuedOwn.Load()) }},
	{"keyline_cluster_slow_consumer_total", "QoS 0 messages NATS dropped because the node fell behind.", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.SlowConsumer.Load()) }},
	{"keyline_cluster_publish_errors_total", "Publishes the cluster could not take.", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.PublishErrors.Load()) }},
	{"keyline_cluster_refused_connections_total", "CONNECTs refused while NATS was unavailable or ownership unsettled.", func(_ *cluster.Node, h *hooks.Cluster) float64 { return float64(h.Stats.Refused.Load()) }},
	{"keyline_cluster_takeovers_total", "Sessions this node took over from another node.", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.Takeovers.Load()) }},
	{"keyline_cluster_released_total", "Sessions other nodes took over from this node.", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.Released.Load()) }},
	{"keyline_cluster_restored_messages_total", "Queued messages restored into sessions taken over.", func(_ *cluster.Node, h *hooks.Cluster) float64 { return float64(h.Stats.Restored.Load()) }},
	{"keyline_cluster_consumer_updates_total", "Updates of the node's consumer filter.", func(n *cluster.Node, _ *hooks.Cluster) float64 { return float64(n.Stats.ConsumerUpdates.Load()) }},
	{"keyline_cluster_wills_published_total", "Wills of clients of nodes that are gone, published by this node.", func(_ *cluster.Node, h *hooks.Cluster) float64 { return float64(h.Stats.Wills.Load()) }},
	{"keyline_cluster_session_record_errors_total", "Session record writes that failed.", func(_ *cluster.Node, h *hooks.Cluster) float64 { return float64(h.Stats.RecordErrors.Load()) }},
}

// answersDropped is the Key-Shared counter of clusterCollector.
var answersDropped = prometheus.NewDesc("keyline_cluster_group_answers_dropped_total",
	"Members' acks, nacks and rejects that reached a group's dispatcher on this node after it stopped holding the group (the next holder settles those messages).", nil, nil)

func (c clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range clusterMetrics {
		ch <- prometheus.NewDesc(m.name, m.help, nil, nil)
	}
	ch <- answersDropped
}

func (c clusterCollector) Collect(ch chan<- prometheus.Metric) {
	n, h := c.b.node, c.b.cluster
	if n == nil || h == nil {
		return
	}
	for _, m := range clusterMetrics {
		typ := prometheus.CounterValue
		if !strings.HasSuffix(m.name, "_total") {
			typ = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(m.name, m.help, nil, nil), typ, m.value(n, h))
	}
	if g := c.b.groups; g != nil {
		ch <- prometheus.MustNewConstMetric(answersDropped, prometheus.CounterValue, float64(g.Stats.AnswersDropped.Load()))
	}
}

// registerCluster serves the cluster-wide client list.
func (b *Broker) registerCluster(mux *http.ServeMux) {
	mux.HandleFunc("GET "+adminapi.PathClusterClients, func(w http.ResponseWriter, r *http.Request) {
		if b.node == nil {
			ops.WriteJSON(w, http.StatusNotFound, adminapi.Error{Error: "not a cluster node (no --nats)"})
			return
		}
		recs, err := b.node.Sessions(r.Context(), 100000)
		if errors.Is(err, sessionrec.ErrCorrupt) {
			// The list has every other session: serve it.
			b.log.Error("cluster clients: skipping session records that cannot be decoded", "error", err)
			err = nil
		}
		if err != nil {
			ops.WriteJSON(w, http.StatusServiceUnavailable, adminapi.Error{Error: err.Error()})
			return
		}
		out := adminapi.ClusterClientList{Clients: []adminapi.ClusterClientView{}}
		for _, rec := range recs {
			out.Clients = append(out.Clients, adminapi.ClusterClientView{ID: rec.ClientID, Node: rec.Owner, Connected: rec.Connected, Persistent: rec.Persistent})
		}
		ops.WriteJSON(w, http.StatusOK, out)
	})
}
