package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// fanoutTarget is a broker measured by measureFanout: subscribers connect
// to subs in turn, publishers to pub.
type fanoutTarget struct {
	subs []string
	pub  string
	// received, when set, counts the cross-node messages its nodes received.
	received func() uint64
}

// fanoutRun is one measured fan-out.
type fanoutRun struct {
	deliveries float64 // messages delivered to subscribers per second
	cpu        float64 // microseconds of this process's CPU per delivery (brokers, NATS servers and clients all run here)
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

// Shape of a measured fan-out: publishers, and QoS 1/2 publishes each keeps
// in flight (QoS 0 publishes keep at most window messages ahead of the
// slowest subscriber instead).
const (
	fanoutPublishers = 4
	fanoutInflight   = 64
	fanoutWindow     = 2000
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func connectBench(b *testing.B, addr, id string, onMsg func(mqtt3.Message)) mqtt3.Client {
	b.Helper()
	o := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetProtocolVersion(4).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).SetOrderMatters(true).
		SetConnectTimeout(mqtttest.Timeout).SetWriteTimeout(mqtttest.Timeout)
	if onMsg != nil {
		o.SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) { onMsg(m) })
	}
	c := mqtt3.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
		b.Fatalf("connect %s to %s: %v", id, addr, tok.Error())
	}
	return c
}

// measureFanout publishes n messages at qos (MQTT 3.1.1, 64-byte payloads)
// from fanoutPublishers clients on tg.pub to subs subscribers spread over
// tg.subs, and waits until every subscriber has every message.
func measureFanout(b *testing.B, tg fanoutTarget, subs, n int, qos byte) fanoutRun {
	b.Helper()
	prefix := fmt.Sprintf("bench/%d", time.Now().UnixNano())
	run, warm := prefix+"/run", prefix+"/warm"
	counts := make([]atomic.Int64, subs)
	warmed := make([]atomic.Bool, subs)
	var clients []mqtt3.Client
	defer func() {
		for _, c := range clients {
			c.Disconnect(0)
		}
	}()
	for i := range subs {
		c := connectBench(b, tg.subs[i%len(tg.subs)], fmt.Sprintf("bsub-%d-%s", i, prefix), func(m mqtt3.Message) {
			if m.Topic() == run {
				counts[i].Add(1)
			} else {
				warmed[i].Store(true)
			}
		})
		clients = append(clients, c)
		if tok := c.Subscribe(prefix+"/#", qos, nil); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
			b.Fatalf("subscribe: %v", tok.Error())
		}
	}
	pubs := make([]mqtt3.Client, fanoutPublishers)
	for i := range pubs {
		pubs[i] = connectBench(b, tg.pub, fmt.Sprintf("bpub-%d-%s", i, prefix), nil)
		clients = append(clients, pubs[i])
	}
	slowest := func() int64 {
		m := counts[0].Load()
		for i := range counts {
			m = min(m, counts[i].Load())
		}
		return m
	}
	// Until every subscriber hears: interest reaches the other NATS servers
	// (and their MQTT consumers) asynchronously after the SUBACK.
	everyone := func() bool {
		for i := range warmed {
			if !warmed[i].Load() {
				return false
			}
		}
		return true
	}
	mqtttest.Eventually(b, 20*time.Second, "every subscriber to hear", func() bool {
		pubs[0].Publish(warm, 1, false, "warm").WaitTimeout(mqtttest.Timeout) // paced by the poll
		return everyone()
	})
	var before uint64
	if tg.received != nil {
		before = tg.received()
	}
	payload := make([]byte, 64)
	cpu0, start := cpuTime(), time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(pubs))
	for p, pub := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var toks []mqtt3.Token
			for i := p; i < n; i += len(pubs) {
				if qos == 0 && int64(i)-slowest() > fanoutWindow &&
					!mqtttest.Within(time.Minute, func() bool { return int64(i)-slowest() <= fanoutWindow }) {
					errs <- fmt.Errorf("subscribers %d messages behind for a minute", int64(i)-slowest())
					return
				}
				toks = append(toks, pub.Publish(run, qos, false, payload))
				if len(toks) > fanoutInflight {
					if !toks[0].WaitTimeout(30*time.Second) || toks[0].Error() != nil {
						errs <- fmt.Errorf("publish: %v", toks[0].Error())
						return
					}
					toks = toks[1:]
				}
			}
			for _, tok := range toks {
				if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
					errs <- fmt.Errorf("publish: %v", tok.Error())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	if !mqtttest.Within(time.Minute, func() bool { return slowest() >= int64(n) }) {
		b.Fatalf("slowest subscriber has %d of %d messages", slowest(), n)
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	r := fanoutRun{
		deliveries: float64(n*subs) / elapsed.Seconds(),
		cpu:        float64(cpu.Microseconds()) / float64(n*subs),
		interested: min(len(tg.subs), subs) - 1,
	}
	if tg.received != nil {
		r.copies = float64(tg.received()-before) / float64(n)
	}
	return r
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
	cluster := fanoutTarget{subs: addrs, pub: addrs[0], received: func() uint64 {
		var sum uint64
		for _, node := range nodes {
			sum += node.ClusterNode().Stats.CoreReceived.Load() + node.ClusterNode().Stats.QueuedReceived.Load()
		}
		return sum
	}}
	natsMQTT := fanoutTarget{subs: nc.MQTTAddrs, pub: nc.MQTTAddrs[0]}
	one := fanoutTarget{subs: []string{single.Addr("tcp")}, pub: single.Addr("tcp")}
	const subs = 30
	for _, qos := range []byte{0, 1} {
		b.Run(fmt.Sprintf("qos%d", qos), func(b *testing.B) {
			kc := measureFanout(b, cluster, subs, b.N, qos)
			peer := measureFanout(b, natsMQTT, subs, b.N, qos)
			ks := measureFanout(b, one, subs, b.N, qos)
			b.ReportMetric(kc.deliveries, "cluster-deliveries/s")
			b.ReportMetric(peer.deliveries, "nats-mqtt-deliveries/s")
			b.ReportMetric(kc.deliveries/peer.deliveries, "cluster/nats-mqtt")
			b.ReportMetric(ks.deliveries, "single-deliveries/s")
			b.ReportMetric(kc.cpu, "cluster-cpu-us/delivery")
			b.ReportMetric(peer.cpu, "nats-mqtt-cpu-us/delivery")
			b.ReportMetric(kc.copies/float64(kc.interested), "msgs/publish/interested-node")
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
