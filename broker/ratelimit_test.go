package broker

import (
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// dialFrom opens a TCP connection to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: mqtttest.Timeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	return packets.NewThreadSafeConn(c)
}

// TestConnectRatePerAddress: past the rate, CONNECTs from one address get
// 0x9F (3.1.1: 0x03) while another address connects.
func TestConnectRatePerAddress(t *testing.T) {
	cfg := testConfig(t)
	cfg.RateLimits.ConnectRatePerAddress = 0.01 // one CONNECT per 100 s: the second is refused however slow the machine
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	connect := func(src, id string) (*mqtttest.V5, error) {
		return mqtttest.TryConnectV5(dialFrom(t, src, addr), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
	}
	first, err := connect("127.0.0.1", "first")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	raw := dialFrom(t, "127.0.0.1", addr)
	defer raw.Close()
	write(t, raw, mqtttest.Connect5("second", nil, nil))
	p, err := mqttwire.NewReader(raw, 1<<16).Next()
	if ack, derr := mqttwire.DecodeConnack(mqttwire.Version5, p); err != nil || derr != nil || ack.ReasonCode != 0x9F {
		t.Errorf("second CONNECT from the same address: CONNACK %+v (%v, %v), want 0x9F", ack, err, derr)
	}
	o := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("v3").SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(mqtttest.Timeout)
	cl := mqtt3.NewClient(o)
	if tok := cl.Connect(); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() == nil {
		cl.Disconnect(0)
		t.Error("a 3.1.1 CONNECT past the rate was accepted")
	} else if tok.(*mqtt3.ConnectToken).ReturnCode() != 0x03 {
		t.Errorf("3.1.1 refusal: return code %#x, want 0x03", tok.(*mqtt3.ConnectToken).ReturnCode())
	}
	other, err := connect("127.0.0.2", "other")
	if err != nil {
		t.Fatalf("another address was refused: %v", err)
	}
	other.Close()
	if got := b.rates.RefusedAddress.Load(); got != 2 {
		t.Errorf("refusals counted: %d, want 2", got)
	}

	// A reload lifts the limit.
	b.SetReloadSource(func() (Config, error) {
		c := cfg
		c.RateLimits.ConnectRatePerAddress = 0
		return c, nil
	})
	if res, err := b.Reload(); err != nil || len(res.NeedRestart) != 0 {
		t.Fatalf("reload: %+v %v", res, err)
	}
	again, err := connect("127.0.0.1", "again")
	if err != nil {
		t.Fatalf("refused after the reload lifted the limit: %v", err)
	}
	again.Close()
}

// TestClientMessagesRate: a client publishing past client-messages-rate is
// read no faster than the rate (its publishes wait, none is lost), while
// another client's publishes go through.
func TestClientMessagesRate(t *testing.T) {
	const rate, n = 50, 150 // a bucket of 50: the last 100 messages take at least 2 s
	cfg := testConfig(t)
	cfg.RateLimits.ClientMessagesRate = rate
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "sub", CleanStart: true, KeepAlive: 30})
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "flood/#", QoS: 1}, paho.SubscribeOptions{Topic: "calm/#", QoS: 1})
	flood := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "flood", CleanStart: true, KeepAlive: 30})
	calm := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "calm", CleanStart: true, KeepAlive: 30})

	start := time.Now()
	done := make(chan time.Duration, 1)
	go func() {
		for range n - 1 {
			flood.Publish(t, &paho.Publish{Topic: "flood/x", QoS: 0, Payload: []byte("f")})
		}
		flood.Publish(t, &paho.Publish{Topic: "flood/x", QoS: 1, Payload: []byte("last")}) // its PUBACK follows every earlier one's reading
		done <- time.Since(start)
	}()
	for i := range 10 {
		if rc := calm.Publish(t, &paho.Publish{Topic: "calm/x", QoS: 1, Payload: []byte{byte(i)}}); rc != 0 {
			t.Fatalf("calm publish: %#x", rc)
		}
	}
	took := <-done
	// The bucket starts full (rate messages), then gives rate a second: a
	// lower bound no load can break.
	if min := time.Duration(float64(n-rate) / rate * float64(time.Second)); took < min*9/10 {
		t.Errorf("%d messages past a rate of %d/s were read in %v, want at least %v", n, rate, took, min)
	}
	got := map[string]int{}
	for range n + 10 {
		got[sub.Next(t).Topic]++
	}
	if got["flood/x"] != n || got["calm/x"] != 10 {
		t.Errorf("delivered %v, want %d flood/x and 10 calm/x: nothing is dropped", got, n)
	}
	if b.rates.Throttled.Load() == 0 {
		t.Error("no throttling counted")
	}
	t.Logf("%d messages at %d/s took %v; throttled %v in %d waits", n, rate, took, time.Duration(b.rates.ThrottledNanos.Load()), b.rates.Throttled.Load())
}
