package broker

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/adminapi"
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
// another client's publishes go through; the admin API shows its inbound
// rate and the time it was throttled.
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
	// While the flood goes on, the admin API shows its inbound rate: no
	// whole second holds more than the bucket and a second's refill.
	var seen adminapi.ClientView
	eventually(t, "flood's inbound rate in the admin API", func() bool {
		seen = clientView(t, b, "flood")
		return seen.MessagesInPerSec > 0
	})
	if seen.MessagesInPerSec > 2*rate {
		t.Errorf("the API shows flood reading %v messages/s, past its limit of %d/s and a full bucket", seen.MessagesInPerSec, rate)
	}
	took := <-done
	fv, cv := clientView(t, b, "flood"), clientView(t, b, "calm")
	if want := time.Duration(b.rates.ThrottledNanos.Load()).Seconds(); fv.ThrottledSeconds <= 0 || fv.ThrottledSeconds != want {
		t.Errorf("the API shows flood throttled %vs, the broker counted %vs", fv.ThrottledSeconds, want)
	}
	if cv.ThrottledSeconds != 0 {
		t.Errorf("calm throttled %vs, want 0", cv.ThrottledSeconds)
	}
	t.Logf("API: flood at %v msg/s (%v B/s) during the flood, throttled %.2fs", seen.MessagesInPerSec, seen.BytesInPerSec, fv.ThrottledSeconds)
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

// userRates has two users, fleet limited to 50 messages/s over all its
// connections and one CONNECT per 100 s, and free with no limit.
const userRates = `
auth:
  users:
    fleet: {password: fleet-pw}
    free: {password: free-pw}
user-rate-limits:
  fleet: {messages-rate: 50, connect-rate: 0.01}
`

// TestUserRateLimits: a user's clients share one bucket (two clients of
// fleet publishing 75 messages each are read no faster than 50/s together)
// while another user's publishes go through; the user's second CONNECT is
// refused 0x9F, a CONNECT with a wrong password in its name does not count,
// and another user connects.
func TestUserRateLimits(t *testing.T) {
	const rate, each = 50, 75 // 150 in all, a bucket of 50: the last 100 take at least 2 s
	cfg := testConfig(t)
	if err := DecodeConfig([]byte(userRates), &cfg); err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	connect := func(id, user, pw string) (*mqtttest.V5, error) {
		return mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30,
			Username: user, UsernameFlag: true, Password: []byte(pw), PasswordFlag: true})
	}
	mustConnect := func(id, user, pw string) *mqtttest.V5 {
		c, err := connect(id, user, pw)
		if err != nil {
			t.Fatalf("%s as %s: %v", id, user, err)
		}
		t.Cleanup(c.Close)
		return c
	}
	// A wrong password in fleet's name first: it must not use up fleet's CONNECT.
	if _, err := connect("impostor", "fleet", "wrong"); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	sub := mustConnect("sub", "free", "free-pw")
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "#", QoS: 1})
	f1 := mustConnect("f1", "fleet", "fleet-pw")
	pc := paho.NewClient(paho.ClientConfig{Conn: mqtttest.Dial(t, mqtttest.TCP, addr, nil)})
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	ack, err := pc.Connect(ctx, &paho.Connect{ClientID: "f2", CleanStart: true, KeepAlive: 30,
		Username: "fleet", UsernameFlag: true, Password: []byte("fleet-pw"), PasswordFlag: true})
	cancel()
	if err == nil || ack == nil || ack.ReasonCode != 0x9F {
		t.Fatalf("fleet's second CONNECT within 100 s: %+v %v, want refused 0x9F", ack, err)
	}
	<-pc.Done()
	if got := b.rates.RefusedUser.Load(); got != 1 {
		t.Errorf("user refusals counted: %d, want 1", got)
	}
	// Lift fleet's CONNECT rate (a reload), keep its message rate.
	b.SetReloadSource(func() (Config, error) {
		c := cfg
		c.RateLimits.UserRateLimits = map[string]UserRateLimit{"fleet": {MessagesRate: rate}}
		return c, nil
	})
	if _, err := b.Reload(); err != nil {
		t.Fatal(err)
	}
	f2 := mustConnect("f2", "fleet", "fleet-pw")
	free := mustConnect("free", "free", "free-pw")

	start := time.Now()
	done := make(chan time.Duration, 2)
	for _, c := range []*mqtttest.V5{f1, f2} {
		go func() {
			for range each - 1 {
				c.Publish(t, &paho.Publish{Topic: "fleet/x", QoS: 0, Payload: []byte("f")})
			}
			c.Publish(t, &paho.Publish{Topic: "fleet/x", QoS: 1, Payload: []byte("last")})
			done <- time.Since(start)
		}()
	}
	for i := range 10 {
		if rc := free.Publish(t, &paho.Publish{Topic: "free/x", QoS: 1, Payload: []byte{byte(i)}}); rc != 0 {
			t.Fatalf("free publish: %#x", rc)
		}
	}
	took := max(<-done, <-done)
	if min := time.Duration(float64(2*each-rate) / rate * float64(time.Second)); took < min*9/10 {
		t.Errorf("fleet's %d messages past its rate of %d/s were read in %v, want at least %v", 2*each, rate, took, min)
	}
	got := map[string]int{}
	for range 2*each + 10 {
		got[sub.Next(t).Topic]++
	}
	if got["fleet/x"] != 2*each || got["free/x"] != 10 {
		t.Errorf("delivered %v, want %d fleet/x and 10 free/x: nothing is dropped", got, 2*each)
	}
	t.Logf("fleet's %d messages at %d/s took %v", 2*each, rate, took)
}

// TestUserRateLimitsNeedAuth: per-user limits without authentication (a
// user name being whatever a client says) are refused, naming the setting.
func TestUserRateLimitsNeedAuth(t *testing.T) {
	cfg := testConfig(t)
	if err := DecodeConfig([]byte("user-rate-limits:\n  fleet: {messages-rate: 5}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "user-rate-limits needs authentication") {
		t.Errorf("Validate: %v", err)
	}
	if err := DecodeConfig([]byte(userRates+"  free: {connect-rate: -1}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "user-rate-limits free connect-rate") {
		t.Errorf("Validate: %v", err)
	}
}

// TestDefaultConnectRatePerAddress: by default one address gets the
// bucket's 1,000 CONNECTs at once and then 100 a second; a loop
// reconnecting past that is refused 0x9F while another address connects.
func TestDefaultConnectRatePerAddress(t *testing.T) {
	cfg := testConfig(t)
	if got := cfg.RateLimits.ConnectRatePerAddress; got != 100 {
		t.Fatalf("default connect-rate-per-address %v", got)
	}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	start := time.Now()
	accepted := 0
	for range 20_000 { // a reconnect loop without back-off: bounded, refused long before
		c := dialFrom(t, "127.0.0.1", addr)
		write(t, c, mqtttest.Connect5("loop", nil, nil))
		p, err := mqttwire.NewReader(c, 1<<16).Next()
		ack, derr := mqttwire.DecodeConnack(mqttwire.Version5, p)
		c.Close()
		if err != nil || derr != nil {
			t.Fatalf("CONNECT %d: %v %v", accepted+1, err, derr)
		}
		if ack.ReasonCode == 0x9F {
			break
		}
		if ack.ReasonCode != 0 {
			t.Fatalf("CONNECT %d: CONNACK %#x", accepted+1, ack.ReasonCode)
		}
		accepted++
	}
	took := time.Since(start)
	// At least the bucket, at most the bucket and what refilled meanwhile.
	if most := 1000 + int(100*took.Seconds()) + 1; accepted < 1000 || accepted > most {
		t.Errorf("one address made %d CONNECTs in %v before a refusal, want 1,000 to %d", accepted, took, most)
	}
	other, err := mqtttest.TryConnectV5(dialFrom(t, "127.0.0.2", addr), &paho.Connect{ClientID: "other", CleanStart: true, KeepAlive: 30})
	if err != nil {
		t.Fatalf("another address was refused: %v", err)
	}
	other.Close()
	t.Logf("%d CONNECTs from one address in %v before the first 0x9F", accepted, took)
}
