package broker

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
)

const refusalAuth = `
auth:
  auth:
    - username: victim
      password: vpw
      allow: true
    - username: other
      password: opw
      allow: true
`

// refusal is one way the broker refuses a CONNECT.
type refusal struct {
	name string
	// owned: the refusal needs a client id another user holds, so every
	// attempt names the victim's.
	owned bool
	// maxClients, when set, makes the broker full once this many clients
	// are connected: the attack finds it full.
	maxClients bool
	// connect is the attacker's CONNECT with client id id.
	connect func(version byte, id string) []byte
	// code is the CONNACK reason code the attacker gets, by version; -1: the
	// connection is closed without a CONNACK.
	code map[byte]int
}

func connectFrame(version byte, id, user, pass string) []byte {
	v := mqttwire.Version311
	if version == 5 {
		v = mqttwire.Version5
	}
	return mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: v, ClientID: id, KeepAlive: 30, Username: user, Password: pass})
}

// badConnect is a CONNECT with protocol level level and connect flags flags.
func badConnect(version, level, flags byte, id string) []byte {
	parts := [][]byte{mqtttest.Str("MQTT"), {level, flags}, mqtttest.U16(30)}
	if version == 5 {
		parts = append(parts, []byte{0}) // no properties
	}
	return mqtttest.Frame(mqttwire.TypeConnect, 0, append(parts, mqtttest.Str(id))...)
}

var refusals = []refusal{
	{name: "bad credentials", connect: func(v byte, id string) []byte { return connectFrame(v, id, "victim", "wrong") },
		code: map[byte]int{4: 0x05, 5: 0x86}}, // 3.1.1: not authorized, as mosquitto answers
	{name: "no credentials", connect: func(v byte, id string) []byte { return connectFrame(v, id, "", "") },
		code: map[byte]int{4: 0x05, 5: 0x86}},
	{name: "id owned by another user", owned: true, connect: func(v byte, id string) []byte { return connectFrame(v, id, "other", "opw") },
		code: map[byte]int{4: 0x05, 5: 0x87}},
	{name: "max clients", maxClients: true, connect: func(v byte, id string) []byte { return connectFrame(v, id, "victim", "vpw") },
		code: map[byte]int{4: 0x03, 5: 0x89}},
	{name: "protocol level", connect: func(v byte, id string) []byte {
		if v == 5 {
			return badConnect(5, 6, 0x02, id) // level 6 does not exist
		}
		return badConnect(4, 3, 0x02, id) // level 3 is MQTT 3.1, named MQIsdp
	}, code: map[byte]int{4: 0x01, 5: 0x82}},
	{name: "protocol error", connect: func(v byte, id string) []byte { return badConnect(v, v, 0x03, id) }, // reserved flag set
		code: map[byte]int{4: -1, 5: 0x82}},
}

// attack sends connect on a new connection and checks the refusal.
func (r refusal) attack(t *testing.T, addr string, version byte, id string) {
	t.Helper()
	c := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
	defer c.Close()
	write(t, c, r.connect(version, id))
	got := readToEOF(t, c)
	want := r.code[version]
	switch {
	case want < 0 && len(got) != 0:
		t.Fatalf("%s: the broker sent % x, want the connection closed without a CONNACK", r.name, got)
	case want >= 0 && (len(got) < 4 || got[0] != packets.Connack<<4 || int(got[3]) != want):
		t.Fatalf("%s: the broker sent % x, want CONNACK %#x", r.name, got, want)
	}
}

// TestRefusedConnectLeavesTheSessionAlone: a CONNECT the broker refuses,
// in every way it refuses one and in both protocol versions, neither takes
// over nor discards the session of the client id it names (online, the
// victim goes on receiving; offline, its queued messages wait for it), and
// leaves nothing behind (mochi attached a fan-out session to every refused
// MQTT 3.1.1 connection, whose refusal codes are below 0x80: it replaced the
// victim's and was never released).
func TestRefusedConnectLeavesTheSessionAlone(t *testing.T) {
	for _, version := range []byte{4, 5} {
		for _, r := range refusals {
			for _, online := range []bool{true, false} {
				t.Run(fmt.Sprintf("v%d/%s/online=%v", version, r.name, online), func(t *testing.T) {
					testRefusal(t, r, version, online)
				})
			}
		}
	}
}

func testRefusal(t *testing.T, r refusal, version byte, online bool) {
	cfg := testConfig(t)
	if err := DecodeConfig([]byte(refusalAuth), &cfg); err != nil {
		t.Fatal(err)
	}
	if r.maxClients {
		cfg.MaxClients = 1 // the publisher
		if online {
			cfg.MaxClients = 2 // and the victim
		}
	}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	victimOpts := rawOptions{version: version, username: "victim", password: "vpw", sessionExpiry: 300}
	victim, _ := dialRaw(t, addr, "victim", victimOpts)
	victim.subscribe("news/#", 1)
	if !online {
		victim.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
		eventually(t, "the victim's connection to end", func() bool { return atomic.LoadInt64(&b.server.Info.ClientsConnected) == 0 })
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30,
		Username: "other", UsernameFlag: true, Password: []byte("opw"), PasswordFlag: true})
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if rc := pub.Publish(t, &paho.Publish{Topic: fmt.Sprintf("news/%d", i), QoS: 1, Payload: []byte("x")}); rc != 0 {
				t.Fatalf("publish %d: %#x", i, rc)
			}
		}
	}
	if !online {
		publish(0, 3) // queued for the offline victim
	}
	r.attack(t, addr, version, "victim")

	if online {
		publish(0, 3)
	} else {
		pub.Close()
		eventually(t, "the publisher's connection to end", func() bool { return atomic.LoadInt64(&b.server.Info.ClientsConnected) == 0 })
		victim, _ = dialRaw(t, addr, "victim", victimOpts)
	}
	for i := range 3 {
		m := victim.nextPublish()
		if want := fmt.Sprintf("news/%d", i); m.TopicName != want {
			t.Fatalf("the victim got %s, want %s", m.TopicName, want)
		}
		victim.ack(m)
	}
	// Refused connections leave nothing behind.
	sessions := b.fanout.Sessions()
	for i := range 20 {
		id := fmt.Sprintf("leak-%d", i)
		if r.owned {
			id = "victim"
		}
		r.attack(t, addr, version, id)
	}
	if n := b.fanout.Sessions(); n != sessions {
		t.Fatalf("fan-out sessions: %d before the refusals, %d after", sessions, n)
	}
	if _, ok := b.server.Clients.Get("leak-0"); ok {
		t.Fatal("mochi keeps a refused client")
	}
}
