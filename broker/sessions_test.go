package broker

import (
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestSessionsExpireAtTheCap: an MQTT 3.1.1 persistent session is kept for
// max-session-expiry and then forgotten; an MQTT 5 client asking for longer
// is told the cap in its CONNACK.
func TestSessionsExpireAtTheCap(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxSessionExpiry = time.Second
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")

	dev := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "old-device", false, nil)
	if q := dev.Subscribe(t, "cmd/old-device", 1); q != 1 {
		t.Fatalf("SUBACK %#x", q)
	}
	dev.Disconnect(0)
	if _, ok := b.server.Clients.Get("old-device"); !ok {
		t.Fatal("the 3.1.1 session was not kept after its client left")
	}
	eventually(t, "the 3.1.1 session expiring after 1s", func() bool {
		_, ok := b.server.Clients.Get("old-device")
		return !ok
	})
	again := mqtt3.NewClient(mqtt3.NewClientOptions().AddBroker(mqtttest.V3URL(mqtttest.TCP, addr)).
		SetClientID("old-device").SetCleanSession(false).SetProtocolVersion(4).SetAutoReconnect(false))
	tok := again.Connect()
	if !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
		t.Fatalf("reconnect: %v", tok.Error())
	}
	defer again.Disconnect(0)
	if tok.(*mqtt3.ConnectToken).SessionPresent() {
		t.Fatal("CONNACK says session present for an expired session")
	}

	long := uint32(3600)
	v5 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{
		ClientID: "asks-an-hour", KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &long},
	})
	if p := v5.Connack.Properties; p == nil || p.SessionExpiryInterval == nil || *p.SessionExpiryInterval != 1 {
		t.Fatalf("CONNACK properties %+v: want session expiry interval 1 (the cap)", p)
	}
}

func TestDefaultSessionExpiryIsAWeek(t *testing.T) {
	if c := DefaultConfig(); c.MaxSessionExpiry != 7*24*time.Hour {
		t.Fatalf("default max-session-expiry %v", c.MaxSessionExpiry)
	}
}
