package broker

import (
	"os"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

const aclConfig = `
auth:
  auth:
    - username: alice
      password: apw
      allow: true
    - username: bob
      password: bpw
      allow: true
  acl:
    - username: bob
      filters:
        "secret/#": 0   # deny
        "orders/#": 1   # read only
`

func TestAuthAndACL(t *testing.T) {
	cfg := testConfig(t)
	if err := DecodeConfig([]byte(aclConfig), &cfg); err != nil {
		t.Fatalf("DecodeConfig: %v", err)
	}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	connect := func(id, user, pass string) *paho.Connect {
		return &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30, Username: user, UsernameFlag: true, Password: []byte(pass), PasswordFlag: true}
	}

	t.Run("wrong password is refused", func(t *testing.T) {
		c, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), connect("mallory", "bob", "nope"))
		if err == nil {
			c.Close()
			t.Fatal("connected with a wrong password")
		}
		t.Logf("refused: %v", err)
	})

	bob := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), connect("bob", "bob", "bpw"))
	alice := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), connect("alice", "alice", "apw"))

	cases := []struct {
		filter string
		want   byte
	}{
		{"orders/#", 1},
		{"$share/workers/orders/#", 1},
		{"secret/#", 0x87},
		{"secret/plans", 0x87},
		// mochi's ledger alone matches the whole "$share/..." string, finds no
		// rule and allows it; the rule for secret/# must apply.
		{"$share/workers/secret/#", 0x87},
		{"$SHARE/workers/secret/plans", 0x87},
	}
	for _, c := range cases {
		if got := bob.Subscribe(t, paho.SubscribeOptions{Topic: c.filter, QoS: 1}); got[0] != c.want {
			t.Errorf("bob SUBSCRIBE %s = %#x, want %#x", c.filter, got[0], c.want)
		}
	}
	if got := alice.Subscribe(t, paho.SubscribeOptions{Topic: "$share/workers/secret/#", QoS: 1}); got[0] != 1 {
		t.Errorf("alice (no ACL rules) SUBSCRIBE $share/workers/secret/# = %#x, want 1", got[0])
	}

	if rc := bob.Publish(t, &paho.Publish{Topic: "orders/1", QoS: 1, Payload: []byte("x")}); rc != 0x87 {
		t.Errorf("bob PUBLISH to read-only orders/1 = %#x, want 0x87 not authorized", rc)
	}
	if rc := alice.Publish(t, &paho.Publish{Topic: "orders/1", QoS: 1, Payload: []byte("x")}); rc != 0 {
		t.Errorf("alice PUBLISH orders/1 = %#x, want success", rc)
	}
	// bob's granted orders/# subscriptions get alice's message (mochi merges a
	// client's matching subscriptions into one delivery).
	if m := bob.Next(t); string(m.Payload) != "x" || m.Topic != "orders/1" {
		t.Errorf("bob got %s %q, want orders/1 \"x\"", m.Topic, m.Payload)
	}

	t.Run("MQTT 3.1.1 denied subscribe gets 0x80", func(t *testing.T) {
		v3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "bob3", true, nil, func(o *mqtt3.ClientOptions) {
			o.SetUsername("bob").SetPassword("bpw")
		})
		if got := v3.Subscribe(t, "$share/g/secret/#", 1); got != 0x80 {
			t.Errorf("SUBACK = %#x, want 0x80", got)
		}
	})
}

// TestReadmeDenyLastExample: the README's deny-last ACL example does what it
// says: each user gets its own topics, in its own direction, and nothing else
// (the example once had no deny rule, so every other topic was allowed).
func TestReadmeDenyLastExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "A deny-last rule set:\n\n```yaml\n")
	example, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("the README has no deny-last example")
	}
	cfg := DefaultConfig()
	if err := DecodeConfig([]byte(example), &cfg); err != nil {
		t.Fatalf("the example does not load: %v", err)
	}
	a := hooks.NewAuth(nil, hooks.NewACL(hooks.NewAuthPolicy(cfg.Auth, nil, true)), hooks.AuthConfig{})
	for _, tc := range []struct {
		user, topic string
		read, want  bool
	}{
		{"device", "sensors/t1", false, true},
		{"device", "sensors/t1", true, false}, // publish only
		{"device", "config/site", false, false},
		{"device", "orders/1", false, false},
		{"worker", "sensors/t1", true, true},
		{"worker", "sensors/t1", false, false}, // subscribe only
		{"worker", "admin/x", true, false},
		{"worker", "billing/x", true, false},
		{"worker", "$SYS/broker/uptime", true, false},
	} {
		if got := a.UserMay(tc.user, tc.topic, !tc.read); got != tc.want {
			t.Errorf("%s %s %s: %v, want %v", tc.user, map[bool]string{true: "reading", false: "publishing to"}[tc.read], tc.topic, got, tc.want)
		}
	}
}
