package broker

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/bridge"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// bridgeTo returns a bridge config to addr with topic lines.
func bridgeTo(t *testing.T, name, addr, protocol string, topics ...string) BridgeConfig {
	t.Helper()
	bc := BridgeConfig{Name: name, Addresses: []string{addr}, ClientID: "edge-" + name, Protocol: protocol,
		ReconnectBackoff: []time.Duration{20 * time.Millisecond, 200 * time.Millisecond}}
	for _, l := range topics {
		r, err := bridge.ParseRule(l)
		if err != nil {
			t.Fatal(err)
		}
		bc.Topics = append(bc.Topics, BridgeTopic{r})
	}
	return bc
}

// waitBridge polls a bridge's status until ok holds.
func waitBridge(t *testing.T, b *Broker, name, what string, ok func(bridge.Status) bool) bridge.Status {
	t.Helper()
	var found bridge.Status
	if !poll.Within(mqtttest.Timeout, func() bool { // the bridge's figures
		for _, st := range b.bridges.Statuses() {
			if st.Name == name && ok(st) {
				found = st
				return true
			}
		}
		return false
	}) {
		t.Fatalf("bridge %s: not %s within %v: %+v", name, what, mqtttest.Timeout, b.bridges.Statuses())
	}
	return found
}

func connected(st bridge.Status) bool  { return st.State == "connected" }
func subscribed(st bridge.Status) bool { return st.Subscribed }

func TestBridgeKeylineToKeylineBothWays(t *testing.T) {
	for _, proto := range []string{"3.1.1", "5"} {
		t.Run("v"+proto, func(t *testing.T) {
			remote := startBroker(t, testConfig(t))
			cfg := testConfig(t)
			cfg.Bridges = []BridgeConfig{bridgeTo(t, "up", remote.Addr("tcp"), proto,
				`sensors/# out 2 "" site1/`, `cmd/# in 2 "" site1/`)}
			edge := startBroker(t, cfg)
			waitBridge(t, edge, "up", "connected and subscribed", subscribed)

			rsub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, remote.Addr("tcp"), nil), &paho.Connect{ClientID: "central", CleanStart: true, KeepAlive: 30})
			rsub.Subscribe(t, paho.SubscribeOptions{Topic: "site1/sensors/#", QoS: 2})
			esub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, edge.Addr("tcp"), nil), &paho.Connect{ClientID: "device", CleanStart: true, KeepAlive: 30})
			esub.Subscribe(t, paho.SubscribeOptions{Topic: "cmd/#", QoS: 2})
			rpub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, remote.Addr("tcp"), nil), &paho.Connect{ClientID: "cloud", CleanStart: true, KeepAlive: 30})
			epub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, edge.Addr("tcp"), nil), &paho.Connect{ClientID: "dev-pub", CleanStart: true, KeepAlive: 30})
			for qos := byte(0); qos <= 2; qos++ {
				for i := range 3 {
					if rc := epub.Publish(t, &paho.Publish{Topic: fmt.Sprintf("sensors/q%d", qos), QoS: qos, Payload: fmt.Appendf(nil, "up-%d-%d", qos, i)}); rc >= 0x80 {
						t.Fatalf("edge publish: %#x", rc)
					}
				}
				for i := range 3 {
					m := rsub.Next(t)
					if want := fmt.Sprintf("up-%d-%d", qos, i); string(m.Payload) != want || m.Topic != fmt.Sprintf("site1/sensors/q%d", qos) || m.QoS != qos {
						t.Fatalf("remote got %s %q QoS %d, want site1/sensors/q%d %q QoS %d", m.Topic, m.Payload, m.QoS, qos, want, qos)
					}
				}
			}
			for qos := byte(0); qos <= 2; qos++ {
				rpub.Publish(t, &paho.Publish{Topic: fmt.Sprintf("site1/cmd/q%d", qos), QoS: qos, Payload: []byte("down")})
				got := esub.Next(t)
				if got.Topic != fmt.Sprintf("cmd/q%d", qos) || got.QoS != qos || string(got.Payload) != "down" {
					t.Fatalf("edge got %s %q QoS %d, want cmd/q%d QoS %d", got.Topic, got.Payload, got.QoS, qos, qos)
				}
			}
			st := waitBridge(t, edge, "up", "counted", func(st bridge.Status) bool { return st.Sent >= 9 && st.Received >= 3 })
			if st.QueuedMessages != 0 || st.InFlight != 0 {
				t.Fatalf("status after everything crossed: %+v", st)
			}
			_, metrics := httpGet(t, "http://"+edge.Addr("http")+"/metrics")
			for _, want := range []string{`keyline_bridge_connected{bridge="up"} 1`, `keyline_bridge_sent_total{bridge="up"} 9`, `keyline_bridge_received_total{bridge="up"} 3`} {
				if !strings.Contains(metrics, want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
			_, groups := httpGet(t, "http://"+edge.Addr("http")+"/api/v1/groups")
			if strings.Contains(groups, "keyline.bridge") {
				t.Errorf("the admin API lists the bridge's internal group: %s", groups)
			}
			if _, page := httpGet(t, "http://"+edge.Addr("http")+"/bridges"); !strings.Contains(page, `data-bridge="up"`) || !strings.Contains(page, "connected") {
				t.Errorf("the console's bridges page: %s", page)
			}
			_, views := httpGet(t, "http://"+edge.Addr("http")+"/api/v1/bridges/up")
			if !strings.Contains(views, `"state": "connected"`) || !strings.Contains(views, `"sent": 9`) {
				t.Errorf("/api/v1/bridges/up: %s", views)
			}
		})
	}
}

const bridgeRemoteACL = `
auth:
  auth:
    - username: edge
      password: epw
      allow: true
    - username: worker
      password: wpw
      allow: true
  acl:
    - username: edge
      filters:
        "site/denied/#": 1   # read only: publishes get 0x87
group-overrides:
  - share: w
    backlog-max-messages: 1
    backlog-policy: reject
`

// TestBridgeRemoteRefusals: a message the remote refuses for good (0x87)
// is dead-lettered at once; one it refuses for now (0x97, a full backlog)
// is retried with backoff until the remote takes it.
func TestBridgeRemoteRefusals(t *testing.T) {
	rcfg := testConfig(t)
	if err := DecodeConfig([]byte(bridgeRemoteACL), &rcfg); err != nil {
		t.Fatal(err)
	}
	remote := startBroker(t, rcfg)
	login := func(id, user, pw string) *paho.Connect {
		return &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30, Username: user, UsernameFlag: true, Password: []byte(pw), PasswordFlag: true}
	}
	// The group w on the remote, without members: it holds one message.
	w := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, remote.Addr("tcp"), nil), login("w0", "worker", "wpw"))
	if rc := w.Subscribe(t, paho.SubscribeOptions{Topic: "$share/w/site/jobs/#", QoS: 1}); rc[0] != 1 {
		t.Fatalf("SUBACK %#x", rc[0])
	}
	w.Close()

	cfg := testConfig(t)
	bc := bridgeTo(t, "up", remote.Addr("tcp"), "5", `denied/# out 1 "" site/`, `jobs/# out 1 "" site/`)
	bc.Username, bc.Password = "edge", "epw"
	cfg.Bridges = []BridgeConfig{bc}
	edge := startBroker(t, cfg)
	waitBridge(t, edge, "up", "connected", connected)
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, edge.Addr("tcp"), nil), &paho.Connect{ClientID: "dev", CleanStart: true, KeepAlive: 30})
	for _, topic := range []string{"denied/1", "jobs/1", "jobs/2"} {
		if rc := pub.Publish(t, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(topic)}); rc != 0 {
			t.Fatalf("edge refused %s: %#x", topic, rc)
		}
	}
	st := waitBridge(t, edge, "up", "refused twice", func(st bridge.Status) bool { return st.DeadLetters == 1 && st.Nacked >= 2 })
	if st.QueuedMessages != 1 {
		t.Fatalf("status %+v: want jobs/2 queued, retrying", st)
	}
	var dlq adminapi.DeadLetterPage
	apiJSON(t, "GET", "http://"+edge.Addr("http")+adminapi.PathDLQ+"?group="+url.QueryEscape("$keyline.bridge.up/denied/#"), "", 200, &dlq)
	if len(dlq.DeadLetters) != 1 || dlq.DeadLetters[0].Topic != "denied/1" || dlq.DeadLetters[0].ReasonCode != 0x87 {
		t.Fatalf("dead letters of the denied rule: %+v", dlq)
	}
	// A member takes jobs/1 from the remote's group; then the retried
	// jobs/2 fits and comes too.
	member := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, remote.Addr("tcp"), nil), login("w1", "worker", "wpw"))
	member.Subscribe(t, paho.SubscribeOptions{Topic: "$share/w/site/jobs/#", QoS: 1})
	for _, want := range []string{"jobs/1", "jobs/2"} {
		if m := member.Next(t); string(m.Payload) != want {
			t.Fatalf("member got %q, want %q", m.Payload, want)
		}
	}
	waitBridge(t, edge, "up", "drained", func(st bridge.Status) bool { return st.QueuedMessages == 0 && st.InFlight == 0 })
}

// TestBridgeRemoteCannotPublishIntoReservedTopics: what a remote sends
// maps to a local topic by the rule's prefixes; one that would start with
// '$' (site/$SYS/... under the prefix site/) is dropped and counted, not
// published into $SYS/ by the broker's own client.
func TestBridgeRemoteCannotPublishIntoReservedTopics(t *testing.T) {
	remote := startBroker(t, testConfig(t))
	cfg := testConfig(t)
	cfg.Bridges = []BridgeConfig{bridgeTo(t, "up", remote.Addr("tcp"), "5", `# in 1 "" site/`)}
	edge := startBroker(t, cfg)
	waitBridge(t, edge, "up", "connected and subscribed", subscribed)
	esub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, edge.Addr("tcp"), nil), &paho.Connect{ClientID: "watch", CleanStart: true, KeepAlive: 30})
	esub.Subscribe(t, paho.SubscribeOptions{Topic: "$SYS/#", QoS: 1}, paho.SubscribeOptions{Topic: "ok/#", QoS: 1})
	rpub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, remote.Addr("tcp"), nil), &paho.Connect{ClientID: "evil", CleanStart: true, KeepAlive: 30})
	rpub.Publish(t, &paho.Publish{Topic: "site/$SYS/broker/clients/connected", QoS: 1, Payload: []byte("999")})
	rpub.Publish(t, &paho.Publish{Topic: "site/ok/1", QoS: 1, Payload: []byte("fine")})
	for {
		m := esub.Next(t)
		if strings.HasPrefix(m.Topic, "$SYS") && string(m.Payload) == "999" {
			t.Fatalf("the remote published into %s here", m.Topic)
		}
		if m.Topic == "ok/1" {
			break // after the forged one: it was dropped
		}
	}
	waitBridge(t, edge, "up", "counted", func(st bridge.Status) bool { return st.Dropped == 1 && st.Received == 1 })
}
