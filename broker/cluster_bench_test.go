package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// fanoutRun is one measured fan-out: publishes from one client on the
// first node to subscribers spread evenly over the nodes.
type fanoutRun struct {
	deliveries float64 // messages delivered to subscribers per second
	copies     float64 // cross-node messages received per publish, summed over nodes
	interested int     // nodes other than the publisher's with subscribers
}

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

// measureFanout publishes n messages at qos to subs subscribers spread over
// nodes and waits until every subscriber has every message. QoS 0 publishes
// keep at most window messages ahead of the slowest subscriber.
func measureFanout(b *testing.B, nodes []*Broker, subs, n int, qos byte) fanoutRun {
	b.Helper()
	const window = 2000
	counts := make([]atomic.Int64, subs)
	topic := fmt.Sprintf("bench/%d/%d", qos, time.Now().UnixNano())
	for i := range subs {
		node := nodes[i%len(nodes)]
		c := paho.NewClient(paho.ClientConfig{
			ClientID: fmt.Sprintf("bsub-%d-%s", i, topic), Conn: mqtttest.Dial(b, mqtttest.TCP, node.Addr("tcp"), nil),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
				counts[i].Add(1)
				return true, nil
			}},
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := c.Connect(ctx, &paho.Connect{ClientID: fmt.Sprintf("bsub-%d-%s", i, topic), CleanStart: true, KeepAlive: 60}); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "bench/#", QoS: qos}}}); err != nil {
			b.Fatal(err)
		}
		cancel()
		b.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}); <-c.Done() })
	}
	pub := mqtttest.ConnectV5(b, mqtttest.Dial(b, mqtttest.TCP, nodes[0].Addr("tcp"), nil), &paho.Connect{ClientID: "bpub-" + topic, CleanStart: true, KeepAlive: 60})
	slowest := func() int64 {
		m := counts[0].Load()
		for i := range counts {
			m = min(m, counts[i].Load())
		}
		return m
	}
	// Warm up until every subscriber gets messages (QoS 0 interest reaches
	// the other NATS servers asynchronously), then reset.
	deadline := time.Now().Add(10 * time.Second)
	for slowest() == 0 {
		if time.Now().After(deadline) {
			b.Fatal("subscribers got nothing")
		}
		pub.Publish(b, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("warm")})
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	for i := range counts {
		counts[i].Store(0)
	}
	received := func() uint64 {
		var sum uint64
		for _, node := range nodes {
			if cn := node.ClusterNode(); cn != nil {
				sum += cn.Stats.CoreReceived.Load() + cn.Stats.QueuedReceived.Load()
			}
		}
		return sum
	}
	before := received()
	payload := make([]byte, 64)
	start := time.Now()
	for i := range n {
		for qos == 0 && int64(i)-slowest() > window {
			time.Sleep(50 * time.Microsecond)
		}
		pub.Publish(b, &paho.Publish{Topic: topic, QoS: qos, Payload: payload})
	}
	deadline = time.Now().Add(60 * time.Second)
	for slowest() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("slowest subscriber has %d of %d messages", slowest(), n)
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	interested := min(len(nodes), subs) - 1
	return fanoutRun{
		deliveries: float64(n*subs) / elapsed.Seconds(),
		copies:     float64(received()-before) / float64(n),
		interested: interested,
	}
}

// BenchmarkClusterFanout compares fan-out to 30 subscribers on one plain
// node with the same subscribers spread over three cluster nodes, in the
// same run, and counts the cross-node messages per publish (one per
// interested node: two here, the publisher's node delivers itself).
//
//	go test -run '^$' -bench ClusterFanout -benchtime 5000x ./broker/
func BenchmarkClusterFanout(b *testing.B) {
	nc := natstest.Start(b, 3)
	single := quietBroker(b, benchConfig(b))
	var nodes []*Broker
	for i, u := range nc.URLs() {
		cfg := benchConfig(b)
		cfg.Cluster.NATS = []string{u}
		cfg.Cluster.NodeID = fmt.Sprintf("bench-%d", i)
		nodes = append(nodes, quietBroker(b, cfg))
	}
	const subs = 30
	for _, qos := range []byte{0, 1} {
		b.Run(fmt.Sprintf("qos%d", qos), func(b *testing.B) {
			one := measureFanout(b, []*Broker{single}, subs, b.N, qos)
			three := measureFanout(b, nodes, subs, b.N, qos)
			b.ReportMetric(one.deliveries, "single-deliveries/s")
			b.ReportMetric(three.deliveries, "cluster-deliveries/s")
			b.ReportMetric(three.deliveries/one.deliveries, "cluster/single")
			b.ReportMetric(three.copies, "cross-node-msgs/publish")
			b.ReportMetric(three.copies/float64(three.interested), "msgs/publish/interested-node")
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
