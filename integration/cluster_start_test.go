package integration

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// startRounds is how many times TestClusterStartsTogether starts a cluster:
// KEYLINE_CLUSTER_START_ROUNDS (the check is 20: about 2 minutes
// here with race-instrumented NATS children, 70 s with a nats-server binary
// in KEYLINE_NATS_SERVER), else 5, which keeps CI short.
func startRounds(t *testing.T) int {
	if v := os.Getenv("KEYLINE_CLUSTER_START_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("KEYLINE_CLUSTER_START_ROUNDS=%q: want a positive number", v)
		}
		return n
	}
	return 5
}

// launchNodes starts n keyline nodes at once, node i preferring NATS server
// i but knowing them all, as an operator's compose file or unit files do.
func launchNodes(t *testing.T, n int, urls []string, extra ...string) []*proc {
	t.Helper()
	var nodes []*proc
	for i := range n {
		order := append(append([]string{}, urls[i%len(urls):]...), urls[:i%len(urls)]...)
		args := append([]string{"--nats", strings.Join(order, ","), "--node-id", fmt.Sprintf("node-%d", i+1),
			"--nats-replicas", "3"}, extra...)
		nodes = append(nodes, launchKeyline(t, 0, t.TempDir(), args...))
	}
	return nodes
}

// waitReady waits for every node's "keyline started" line and /readyz 200.
func waitReady(t *testing.T, nodes []*proc, d time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan string, len(nodes))
	for i, p := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case p.addrs = <-p.ready:
			case <-p.done:
				errs <- fmt.Sprintf("node-%d exited before it was ready: %v", i+1, p.err)
				return
			case <-time.After(d):
				errs <- fmt.Sprintf("node-%d not started within %v", i+1, d)
				return
			}
			resp, err := http.Get("http://" + p.addrs["http"] + "/readyz")
			if err != nil {
				errs <- fmt.Sprintf("node-%d /readyz: %v", i+1, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- fmt.Sprintf("node-%d started but /readyz says %d", i+1, resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []string
	for e := range errs {
		all = append(all, e)
	}
	if len(all) > 0 {
		for i, p := range nodes {
			t.Logf("node-%d logs:\n%s", i+1, p.Logs())
		}
		t.Fatal(strings.Join(all, "; "))
	}
}

// crossNode checks that a QoS 1 message published on the first node
// reaches a subscriber on the last.
func crossNode(t *testing.T, nodes []*proc, topic string) {
	t.Helper()
	last := nodes[len(nodes)-1]
	sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, last.addrs["tcp"], nil), &paho.Connect{ClientID: "sub-" + topic, CleanStart: true, KeepAlive: 30})
	sub.Subscribe(t, paho.SubscribeOptions{Topic: topic, QoS: 1})
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, nodes[0].addrs["tcp"], nil), &paho.Connect{ClientID: "pub-" + topic, CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("hello")})
	if m := sub.Next(t); string(m.Payload) != "hello" {
		t.Fatalf("got %q on %s", m.Payload, m.Topic)
	}
}

// TestClusterStartsTogether starts three keyline nodes at the same moment
// as a freshly started three-server NATS cluster (servers started
// together, nobody waiting for anybody), startRounds times in a row: every
// node becomes ready every time, and the cluster carries a message. NATS
// answers only one of several parallel creates of one clustered stream and
// drops JetStream requests sent before its meta leader exists, so nodes
// that do not retry idempotently fail here (4 of 5 tries did before).
func TestClusterStartsTogether(t *testing.T) {
	rounds := startRounds(t)
	var took []time.Duration
	for r := range rounds {
		ok := t.Run(fmt.Sprintf("round-%02d", r+1), func(t *testing.T) {
			pc := natstest.NewProcs(t, 3, natstest.ServerBin())
			began := time.Now()
			for i := range 3 {
				pc.Start(t, i)
			}
			nodes := launchNodes(t, 3, pc.URLs())
			waitReady(t, nodes, 60*time.Second)
			took = append(took, time.Since(began))
			crossNode(t, nodes, "start/round"+strconv.Itoa(r))
		})
		if !ok {
			break
		}
	}
	slices.Sort(took)
	if len(took) > 0 {
		t.Logf("%d rounds: every node ready after %v (median), %v (slowest), counted from the start of the NATS servers",
			len(took), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	}
}

// TestClusterStartsBeforeLastNATSServer starts two of three NATS servers
// with the nodes and the third 10 s later: a fresh NATS cluster one server
// short has no JetStream yet (it waits for its peers), so the nodes wait,
// saying what for, and are ready soon after the third server is up.
func TestClusterStartsBeforeLastNATSServer(t *testing.T) {
	pc := natstest.NewProcs(t, 3, natstest.ServerBin())
	pc.Start(t, 0)
	pc.Start(t, 1)
	nodes := launchNodes(t, 3, pc.URLs())
	// A deliberate wall-clock wait: the scenario is a server that comes up
	// 10 s after the nodes, and the nodes must not have given up by then.
	time.Sleep(10 * time.Second)
	for i, p := range nodes {
		select {
		case <-p.done:
			t.Fatalf("node-%d exited while NATS was one server short: %v\n%s", i+1, p.err, p.Logs())
		default:
		}
	}
	third := time.Now()
	pc.Start(t, 2)
	waitReady(t, nodes, 30*time.Second)
	t.Logf("every node ready %v after the third NATS server started", time.Since(third).Round(time.Millisecond))
	for i, p := range nodes {
		if !strings.Contains(p.Logs(), "waiting for NATS JetStream") {
			t.Errorf("node-%d did not say what it waited for:\n%s", i+1, p.Logs())
		}
	}
	crossNode(t, nodes, "start/late")
}
