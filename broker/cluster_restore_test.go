package broker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/internal/outbox"
)

// heldRestore is a node's session outboxes that hold the rebuild of one
// client's session where the cluster hook has made its copy and not yet
// replayed its queued messages, until the test lets it go on.
type heldRestore struct {
	hooks.SessionOutboxes
	id      string
	reached chan struct{} // closed when the rebuild is held
	goOn    chan struct{} // closed by the test
}

func (o *heldRestore) RequeueSession(id string, version byte, msgs []outbox.Queued) int {
	if id == o.id {
		close(o.reached)
		select {
		case <-o.goOn:
		case <-time.After(mqtttest.Timeout): // a test that failed first does not hang the node
		}
	}
	return o.SessionOutboxes.RequeueSession(id, version, msgs)
}

// TestClusterTakeoverDuringRestoreKeepsQueued: a node rebuilding a session
// from its record (node b) is asked to release it before it has replayed
// the session's queued messages (the client went on to node c). The record
// b writes must keep those messages above its floor: c delivers all of
// them. (In TestClusterRollingRestart a subscriber stuck in a CONNECT on a
// node that was stopping went on to the next node, and 200 acknowledged
// messages never reached it: b wrote its node's read position as the floor.)
func TestClusterTakeoverDuringRestoreKeepsQueued(t *testing.T) {
	nc := natstest.Start(t, 3)
	urls := nc.URLs()
	bs := startClusterBrokers(t, 1, urls)
	a := bs[0]
	cfg := testConfig(t)
	cfg.Cluster.NATS, cfg.Cluster.NodeID = []string{urls[1]}, "node-b"
	var held *heldRestore
	b := startBrokerWith(t, cfg, func(b *Broker) {
		held = &heldRestore{SessionOutboxes: b.fanout, id: "keep-dev", reached: make(chan struct{}), goOn: make(chan struct{})}
		b.cluster.Outboxes = held
	})
	cfg = testConfig(t)
	cfg.Cluster.NATS, cfg.Cluster.NodeID = []string{urls[2]}, "node-c"
	c := startBroker(t, cfg)

	dev := connectPersistent(t, a, "keep-dev", true)
	dev.Subscribe(t, paho.SubscribeOptions{Topic: "keep/#", QoS: 1})
	dev.Close() // offline; the session stays on node a
	pub := dialV5(t, a, &paho.Connect{ClientID: "keep-pub", CleanStart: true, KeepAlive: 30})
	const n = 50
	for i := range n {
		if rc := pub.Publish(t, &paho.Publish{Topic: "keep/a", QoS: 1, Payload: fmt.Appendf(nil, "m-%d", i)}); rc != 0 {
			t.Fatalf("publish %d answered %#x", i, rc)
		}
	}
	last, err := a.ClusterNode().LastSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	// The session moves to node b, which holds its rebuild.
	connected := make(chan struct{})
	conn := mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil) // here: Dial may t.Fatal
	go func() {
		defer close(connected)
		expiry := uint32(3600)
		if v, err := mqtttest.TryConnectV5(conn, &paho.Connect{ClientID: "keep-dev", KeepAlive: 30,
			Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}); err == nil {
			v.Close()
		}
	}()
	select {
	case <-held.reached:
	case <-time.After(mqtttest.Timeout):
		t.Fatal("node b did not start rebuilding the session")
	}
	// Node b's consumer reads past the queued messages (the session's filter
	// is in its interest now): that read position is not the session's floor.
	waitFor(t, 10*time.Second, "node b to read past the queued messages", func() bool {
		return b.ClusterNode().QueuedPosition() >= last
	})

	// The client goes on to node c, which asks node b to release it.
	dev = connectPersistent(t, c, "keep-dev", false)
	close(held.goOn)
	seen := map[int]bool{}
	deadline := time.After(mqtttest.Timeout)
	for len(seen) < n {
		select {
		case m := <-dev.Msgs:
			s := string(m.Payload)
			if i, err := strconv.Atoi(s[strings.LastIndexByte(s, '-')+1:]); err == nil {
				seen[i] = true
			}
		case <-deadline:
			var missing []int
			for i := range n {
				if !seen[i] {
					missing = append(missing, i)
				}
			}
			t.Fatalf("keep-dev on node c: %d of %d acknowledged messages never arrived: %v", len(missing), n, missing)
		}
	}
	<-connected
}
