package broker

import (
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

const willACLConfig = `
auth:
  auth:
    - username: dev1
      password: pw
      allow: true
    - username: ops
      password: pw
      allow: true
  acl:
    - username: dev1
      filters:
        "devices/dev1/#": 3
        "#": 1   # read the rest, write nothing else
`

// TestWillTheClientMayNotPublishIsRefused: a will is a publish made for the
// client when it goes; a CONNECT whose will the client may not publish (by
// the ACL, or into a reserved topic) is refused with 0x87 Not authorized
// (MQTT 3.1.1: 0x05), so that nobody writes through a will where it may not
// publish (another device's command topic).
func TestWillTheClientMayNotPublishIsRefused(t *testing.T) {
	cfg := testConfig(t)
	if err := DecodeConfig([]byte(willACLConfig), &cfg); err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	ops := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "ops", CleanStart: true, KeepAlive: 30,
		Username: "ops", UsernameFlag: true, Password: []byte("pw"), PasswordFlag: true})
	ops.Subscribe(t, paho.SubscribeOptions{Topic: "devices/#", QoS: 1})

	for _, tc := range []struct {
		version byte
		topic   string
		want    byte
	}{
		{5, "devices/dev2/cmd", 0x87},
		{4, "devices/dev2/cmd", 0x05},
		{5, "$SYS/broker/uptime", 0x87},
		{5, "devices/dev1/status", 0},
	} {
		_, ack := dialRawAck(t, addr, "dev1", rawOptions{version: tc.version, clean: true, username: "dev1", password: "pw", willTopic: tc.topic})
		if ack.ReasonCode != tc.want {
			t.Errorf("MQTT %d CONNECT with a will on %s: CONNACK %#x, want %#x", tc.version, tc.topic, ack.ReasonCode, tc.want)
		}
	}
	// The refused connections left no will behind (the accepted one's
	// connection is still open).
	expectNone(t, ops, "ops")
	if got := b.auth.WillsRefused.Load(); got != 3 {
		t.Errorf("wills refused: %d, want 3", got)
	}

	// A reload that takes the right away drops the will of a connection
	// made before it, when the connection goes: what the CONNECT would be
	// refused for now is not published either.
	dev, _ := dialRawAck(t, addr, "dev1-old", rawOptions{version: 5, clean: true, username: "dev1", password: "pw", willTopic: "devices/dev1/old"})
	keep, _ := dialRawAck(t, addr, "dev1-keep", rawOptions{version: 5, clean: true, username: "dev1", password: "pw", willTopic: "devices/dev1/keep"})
	var fresh Config
	if err := DecodeConfig([]byte(strings.ReplaceAll(willACLConfig, `"devices/dev1/#": 3`, `"devices/dev1/keep": 3`)), &fresh); err != nil {
		t.Fatal(err)
	}
	c := cfg
	c.Auth = fresh.Auth
	b.SetReloadSource(func() (Config, error) { return c, nil })
	if res, err := b.Reload(); err != nil || len(res.NeedRestart) != 0 {
		t.Fatalf("reload: %+v %v", res, err)
	}
	_ = dev.c.Close() // no DISCONNECT: the will goes, or would
	_ = keep.c.Close()
	if m := ops.Next(t); m.Topic != "devices/dev1/keep" {
		t.Fatalf("ops got the will on %s, want only devices/dev1/keep's", m.Topic)
	}
	expectNone(t, ops, "ops")
	if got := b.auth.WillsRefused.Load(); got != 4 {
		t.Errorf("wills refused: %d, want 4", got)
	}
}
