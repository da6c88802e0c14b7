package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

func quietBroker(tb testing.TB, cfg Config) *Broker {
	tb.Helper()
	b, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	if err := b.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.Shutdown(ctx)
	})
	return b
}

// BenchmarkClusterFanout measures fan-out to 30 subscribers (MQTT 3.1.1)
// spread over three cluster nodes, from four publishers on the first
// node, beside the peer in the same run: nats-server's own MQTT on the
// same three NATS servers (subscribers spread the same way). It reports one
// plain keyline node with all 30 subscribers too, and counts the
// cross-node messages per publish (one per interested node: two here, the
// publisher's node delivers itself).
//
//	go test -run '^$' -bench ClusterFanout -benchtime 3000x ./broker/
func BenchmarkClusterFanout(b *testing.B) {
	nc := natstest.StartWith(b, 3, natstest.Options{MQTT: true})
	single := quietBroker(b, benchConfig(b))
	var nodes []*Broker
	var addrs []string
	for i, u := range nc.URLs() {
		cfg := benchConfig(b)
		cfg.Cluster.NATS = []string{u}
		cfg.Cluster.NodeID = fmt.Sprintf("bench-%d", i)
		node := quietBroker(b, cfg)
		nodes = append(nodes, node)
		addrs = append(addrs, node.Addr("tcp"))
	}
	cluster := mqtttest.FanoutTarget{Subs: addrs, Pub: addrs[0], Received: func() uint64 {
		var sum uint64
		for _, node := range nodes {
			sum += node.ClusterNode().Stats.CoreReceived.Load() + node.ClusterNode().Stats.QueuedReceived.Load()
		}
		return sum
	}}
	natsMQTT := mqtttest.FanoutTarget{Subs: nc.MQTTAddrs, Pub: nc.MQTTAddrs[0]}
	one := mqtttest.FanoutTarget{Subs: []string{single.Addr("tcp")}, Pub: single.Addr("tcp")}
	const subs = 30
	for _, qos := range []byte{0, 1} {
		b.Run(fmt.Sprintf("qos%d", qos), func(b *testing.B) {
			kc := mqtttest.MeasureFanout(b, cluster, subs, b.N, qos)
			peer := mqtttest.MeasureFanout(b, natsMQTT, subs, b.N, qos)
			ks := mqtttest.MeasureFanout(b, one, subs, b.N, qos)
			b.ReportMetric(kc.Deliveries, "cluster-deliveries/s")
			b.ReportMetric(peer.Deliveries, "nats-mqtt-deliveries/s")
			b.ReportMetric(kc.Deliveries/peer.Deliveries, "cluster/nats-mqtt")
			b.ReportMetric(ks.Deliveries, "single-deliveries/s")
			b.ReportMetric(kc.CPU, "cluster-cpu-us/delivery")
			b.ReportMetric(peer.CPU, "nats-mqtt-cpu-us/delivery")
			b.ReportMetric(kc.Copies/float64(kc.Interested), "msgs/publish/interested-node")
		})
	}
}

func benchConfig(tb testing.TB) Config {
	cfg := DefaultConfig()
	cfg.TCP = "127.0.0.1:0"
	cfg.HTTP = ""
	cfg.DataDir = tb.TempDir()
	cfg.Fsync = false
	cfg.LogLevel = LogError
	return cfg
}
