package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

var benchRun atomic.Int64

// measureGroups publishes n QoS 1 messages over 1,000 keys into groups
// Key-Shared groups whose members (membersPerNode on every node) acknowledge
// at once, from one publisher per node with conc publishes in flight each,
// and returns the messages delivered per second and how many nodes hold
// the groups' leases.
func measureGroups(b *testing.B, nodes []*Broker, groups, membersPerNode, n, conc int) (float64, int) {
	b.Helper()
	run := benchRun.Add(1)
	var delivered atomic.Int64
	for g := range groups {
		for i, node := range nodes {
			for m := range membersPerNode {
				id := fmt.Sprintf("bm-%d-%d-%d-%d", run, g, i, m)
				c := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: mqtttest.Dial(b, mqtttest.TCP, node.Addr("tcp"), nil),
					OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
						delivered.Add(1)
						return true, nil
					}}})
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 60}); err != nil {
					b.Fatal(err)
				}
				filter := fmt.Sprintf("$share/bg%d-%d/kb/%d/%d/#", run, g, run, g)
				if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
					b.Fatal(err)
				}
				cancel()
				b.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}); <-c.Done() })
			}
		}
	}
	holders := map[string]bool{}
	for g := range groups {
		name := fmt.Sprintf("bg%d-%d/kb/%d/%d/#", run, g, run, g)
		mqtttest.Eventually(b, 30*time.Second, "the members of "+name+" at its dispatcher", func() bool {
			st, err := nodes[0].keyShared.Group(name)
			if err == nil && (st.Holder != "" || len(nodes) == 1 && nodes[0].groups == nil) && st.Stats.Members == len(nodes)*membersPerNode {
				holders[st.Holder] = true
				return true
			}
			return false
		})
	}
	var pubs []*mqtttest.V5
	for i, node := range nodes {
		pubs = append(pubs, mqtttest.ConnectV5(b, mqtttest.Dial(b, mqtttest.TCP, node.Addr("tcp"), nil),
			&paho.Connect{ClientID: fmt.Sprintf("bp-%d-%d", run, i), CleanStart: true, KeepAlive: 60}))
	}
	payload := make([]byte, 64)
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range pubs {
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(n) {
						return
					}
					g, key := i%int64(groups), fmt.Sprintf("k%d", i%1000)
					_, err := p.Client.Publish(context.Background(), &paho.Publish{Topic: fmt.Sprintf("kb/%d/%d/x", run, g), QoS: 1, Payload: payload,
						Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
					if err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if !mqtttest.Within(2*time.Minute, func() bool { return delivered.Load() >= int64(n) }) {
		b.Fatalf("%d of %d delivered", delivered.Load(), n)
	}
	return float64(n) / time.Since(start).Seconds(), len(holders)
}

// BenchmarkClusterKeyShared measures Key-Shared groups across nodes (one
// NATS cluster of three in process, clients over loopback, all on this
// machine's cores): one group with members and publishers on three nodes,
// and eight groups on three nodes against the same eight on one node.
//
//	go test -run '^$' -bench ClusterKeyShared -benchtime 20000x ./broker/
func BenchmarkClusterKeyShared(b *testing.B) {
	nc := natstest.Start(b, 3)
	var nodes []*Broker
	for i, u := range nc.URLs() {
		cfg := benchConfig(b)
		cfg.Cluster.NATS = []string{u}
		cfg.Cluster.NodeID = fmt.Sprintf("kbench-%d", i)
		nodes = append(nodes, quietBroker(b, cfg))
	}
	b.Run("1group-3nodes", func(b *testing.B) {
		rate, _ := measureGroups(b, nodes, 1, 2, b.N, 16)
		b.ReportMetric(rate, "msgs/s")
	})
	// The single node has a NATS cluster of its own: nodes on one NATS
	// cluster share their groups' dispatch.
	soloNATS := natstest.Start(b, 3)
	cfg := benchConfig(b)
	cfg.Cluster.NATS = []string{soloNATS.URLs()[0]}
	cfg.Cluster.NodeID = "kbench-solo"
	solo := quietBroker(b, cfg)
	b.Run("8groups", func(b *testing.B) {
		one, _ := measureGroups(b, []*Broker{solo}, 8, 3, b.N, 48)
		three, holders := measureGroups(b, nodes, 8, 1, b.N, 16)
		b.ReportMetric(one, "1node-msgs/s")
		b.ReportMetric(three, "3nodes-msgs/s")
		b.ReportMetric(three/one, "3nodes/1node")
		b.ReportMetric(float64(holders), "dispatching-nodes")
	})
}
