package broker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/bridge"
	"github.com/keyline-mq/keyline/internal/mqtttest"
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
	deadline := time.Now().Add(mqtttest.Timeout)
	for {
		for _, st := range b.bridges.Statuses() {
			if st.Name == name && ok(st) {
				return st
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("bridge %s: not %s within %v: %+v", name, what, mqtttest.Timeout, b.bridges.Statuses())
		}
		time.Sleep(5 * time.Millisecond) // polling the bridge's figures
	}
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
			_, views := httpGet(t, "http://"+edge.Addr("http")+"/api/v1/bridges/up")
			if !strings.Contains(views, `"state": "connected"`) || !strings.Contains(views, `"sent": 9`) {
				t.Errorf("/api/v1/bridges/up: %s", views)
			}
		})
	}
}
