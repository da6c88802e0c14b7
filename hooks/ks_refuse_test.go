package hooks

import (
	"errors"
	"net"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// unopenable is a backend that cannot create one group (a store or a
// JetStream cluster that does not answer in time).
type unopenable struct {
	keyshared.Backend
	group string
}

func (b unopenable) EnsureGroup(name string, cfg keyshared.GroupConfig) (bool, error) {
	if name == b.group {
		return false, errors.New("the group's stream did not answer in time")
	}
	return b.Backend.EnsureGroup(name, cfg)
}

// A shared subscription whose group cannot be opened is refused in the
// SUBACK (0x80), not granted and then silent; the other filters of the same
// SUBSCRIBE are granted.
func TestSharedSubscriptionRefusedWhenItsGroupCannotOpen(t *testing.T) {
	server := mqtt.New(&mqtt.Options{InlineClient: true})
	db, err := persistence.Open(t.TempDir(), persistence.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	h := NewKeyShared(server, unopenable{keyshared.NewLocalBackend(db.Groups()), "broken/jobs/#"}, KeySharedConfig{
		KeyProperty: "key",
		GroupSettings: func(string) (keyshared.Config, persistence.GroupConfig) {
			return keyshared.DefaultConfig(), persistence.GroupConfig{}
		},
	})
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := server.AddHook(h, nil); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := server.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := server.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = server.Close()
		_ = db.Close()
	})
	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, ln.Addr().String(), nil), &paho.Connect{ClientID: "w", CleanStart: true, KeepAlive: 30})
	t.Cleanup(c.Close)
	got := c.Subscribe(t, paho.SubscribeOptions{Topic: "$share/broken/jobs/#", QoS: 1}, paho.SubscribeOptions{Topic: "$share/fine/jobs/#", QoS: 1})
	if len(got) != 2 || got[0] != 0x80 || got[1] != 1 {
		t.Fatalf("SUBACK reason codes %x, want [80 01]", got)
	}
	if h.members.get("w", "broken/jobs/#") != nil || h.members.get("w", "fine/jobs/#") == nil {
		t.Fatalf("memberships: broken %v, fine %v; want only fine", h.members.get("w", "broken/jobs/#"), h.members.get("w", "fine/jobs/#"))
	}
}
