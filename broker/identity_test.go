package broker

import (
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/passwd"
	"github.com/keyline-mq/keyline/internal/poll"
)

// deviceACL gives each device its own topics and nothing else.
const deviceACL = `
auth:
  acl:
    - username: sensor-1
      filters:
        "devices/sensor-1/#": 3
        "#": 0
    - username: sensor-2
      filters:
        "devices/sensor-2/#": 3
        "#": 0
`

// certBroker starts a broker with tls and wss listeners that require client
// certificates of ca and take their CN as the user name.
func certBroker(t *testing.T, ca *mqtttest.CA, crl string) (*Broker, mqtttest.Leaf) {
	t.Helper()
	srv := ca.Leaf(t, "broker", mqtttest.LeafOptions{Server: true})
	cfg := testConfig(t)
	if err := DecodeConfig([]byte(deviceACL), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.TLS, cfg.WSS, cfg.TLSCert, cfg.TLSKey = "127.0.0.1:0", "127.0.0.1:0", srv.CertFile, srv.KeyFile
	cfg.TLSClientCA, cfg.TLSClientAuth, cfg.TLSIdentity, cfg.TLSCRL = ca.File, ClientAuthRequire, IdentityCN, crl
	return startBroker(t, cfg), srv
}

// tlsRefused dials addr with conf and reports the error the handshake (or,
// in TLS 1.3, the first read after it) ends with; nil if it connected.
func tlsRefused(t *testing.T, addr string, conf *tls.Config) error {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: mqtttest.Timeout}, "tcp", addr, conf)
	if err != nil {
		return err
	}
	defer c.Close()
	// The server's verdict on a TLS 1.3 client certificate comes after the
	// client's handshake is done: a CONNECT, then the first read, sees it.
	_, _ = c.Write(mqtttest.Connect5("probe", nil, nil))
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	if _, err := c.Read(make([]byte, 64)); err != nil {
		return err
	}
	return nil
}

func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := mqtttest.NewCA(t, dir, "devices")
	good := ca.Leaf(t, "sensor-1", mqtttest.LeafOptions{})
	lost := ca.Leaf(t, "sensor-2", mqtttest.LeafOptions{})
	expired := ca.Leaf(t, "sensor-old", mqtttest.LeafOptions{NotAfter: time.Now().Add(-time.Hour)})
	stranger := mqtttest.NewCA(t, t.TempDir(), "elsewhere").Leaf(t, "sensor-1", mqtttest.LeafOptions{})
	b, _ := certBroker(t, ca, ca.CRL(t, "crl.pem", lost.Cert))

	t.Run("a device connects as its certificate's CN, without a password, under its ACL", func(t *testing.T) {
		c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TLS, b.Addr("tls"), mqtttest.ClientTLS(t, ca, good)),
			&paho.Connect{ClientID: "s1", CleanStart: true, KeepAlive: 30, Username: "sensor-2", UsernameFlag: true})
		if rc := c.Publish(t, &paho.Publish{Topic: "devices/sensor-1/temp", QoS: 1, Payload: []byte("21")}); rc != 0 {
			t.Errorf("publish to its own topic = %#x, want 0", rc)
		}
		if rc := c.Publish(t, &paho.Publish{Topic: "devices/sensor-2/temp", QoS: 1, Payload: []byte("21")}); rc != 0x87 {
			t.Errorf("publish to another device's topic (the user name it claimed) = %#x, want 0x87", rc)
		}
		cl, ok := b.Server().Clients.Get("s1")
		if !ok || string(cl.Properties.Username) != "sensor-1" {
			t.Errorf("the client's user name is not its certificate's CN")
		}
	})

	t.Run("over wss with paho 3.1.1", func(t *testing.T) {
		sub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.WSS, b.Addr("wss")), "s1-wss", true, mqtttest.ClientTLS(t, ca, good))
		if rc := sub.Subscribe(t, "devices/sensor-1/#", 1); rc != 1 {
			t.Fatalf("SUBACK %#x, want 1", rc)
		}
		if rc := sub.Subscribe(t, "devices/sensor-2/#", 1); rc != 0x80 {
			t.Errorf("SUBACK for another device's topics %#x, want 0x80", rc)
		}
		pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.WSS, b.Addr("wss"), mqtttest.ClientTLS(t, ca, good)),
			&paho.Connect{ClientID: "s1-pub", CleanStart: true, KeepAlive: 30})
		pub.Publish(t, &paho.Publish{Topic: "devices/sensor-1/temp", QoS: 1, Payload: []byte("22")})
		if m := sub.Next(t); string(m.Payload()) != "22" {
			t.Errorf("got %q over wss", m.Payload())
		}
	})

	for _, tc := range []struct {
		name   string
		conf   *tls.Config
		reason int
	}{
		{"an expired certificate", mqtttest.ClientTLS(t, ca, expired), refusedExpired},
		{"a certificate of another CA", mqtttest.ClientTLS(t, ca, stranger), refusedUntrusted},
		{"a revoked certificate", mqtttest.ClientTLS(t, ca, lost), refusedRevoked},
	} {
		t.Run(tc.name+" is refused in the handshake", func(t *testing.T) {
			before := b.tls.refused[tc.reason].Load()
			for _, addr := range []string{b.Addr("tls"), b.Addr("wss")} {
				if err := tlsRefused(t, addr, tc.conf); err == nil {
					t.Fatalf("%s: connected", addr)
				} else {
					t.Logf("%s: %v", addr, err)
				}
			}
			if got := b.tls.refused[tc.reason].Load() - before; got != 2 {
				t.Errorf("refusals counted as %s: %d, want 2", refusalNames[tc.reason], got)
			}
		})
	}
	t.Run("no certificate is refused", func(t *testing.T) {
		if err := tlsRefused(t, b.Addr("tls"), mqtttest.ClientTLS(t, ca, mqtttest.Leaf{})); err == nil {
			t.Fatal("connected without a certificate")
		}
	})
}

// TestReloadCertificates rotates the client CA bundle and the server
// certificate with a device connected, then revokes that device.
func TestReloadCertificates(t *testing.T) {
	dir := t.TempDir()
	ca1 := mqtttest.NewCA(t, dir, "old")
	ca2 := mqtttest.NewCA(t, dir, "new")
	dev1 := ca1.Leaf(t, "sensor-1", mqtttest.LeafOptions{})
	dev2 := ca2.Leaf(t, "sensor-2", mqtttest.LeafOptions{})
	b, srv := certBroker(t, ca1, "")
	addr := b.Addr("tls")
	// the server certificate is ca1's: clients trust both CAs through the rotation
	trustBoth := func(leaf mqtttest.Leaf) *tls.Config {
		c := mqtttest.ClientTLS(t, ca1, leaf)
		c.RootCAs.AddCert(ca2.Cert)
		return c
	}
	c1 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TLS, addr, trustBoth(dev1)), &paho.Connect{ClientID: "s1", CleanStart: true, KeepAlive: 30})
	c1.Subscribe(t, paho.SubscribeOptions{Topic: "devices/sensor-1/#", QoS: 1})
	if err := tlsRefused(t, addr, trustBoth(dev2)); err == nil {
		t.Fatal("a device of a CA not yet in the bundle connected")
	}

	// A broken bundle: the reload fails, nothing changes.
	if err := os.WriteFile(ca1.File, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	saved := b.tls.cur.Load()
	if _, err := b.Reload(); err == nil || !strings.Contains(err.Error(), ca1.File) {
		t.Fatalf("reload of a broken CA bundle: %v, want an error naming %s", err, ca1.File)
	}
	if b.tls.cur.Load() != saved || b.reload.bad.Load() != 1 {
		t.Fatal("a failed reload changed the TLS material or was not counted")
	}

	// Rotation: the bundle holds both CAs, the server certificate is ca2's.
	bundle := append(pemOf(t, ca1.Cert.Raw), pemOf(t, ca2.Cert.Raw)...)
	if err := os.WriteFile(ca1.File, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	newSrv := ca2.Leaf(t, "broker-2", mqtttest.LeafOptions{Server: true})
	copyFile(t, newSrv.CertFile, srv.CertFile)
	copyFile(t, newSrv.KeyFile, srv.KeyFile)
	res, err := b.Reload()
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if len(res.Disconnected) != 0 {
		t.Errorf("disconnected %v, want none", res.Disconnected)
	}
	c2 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TLS, addr, trustBoth(dev2)), &paho.Connect{ClientID: "s2", CleanStart: true, KeepAlive: 30})
	c2.Close()
	conn, err := tls.Dial("tcp", addr, trustBoth(dev1))
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(newSrv.Cert.SerialNumber) != 0 {
		t.Errorf("server certificate after the reload has serial %v, want the new one's %v", got, newSrv.Cert.SerialNumber)
	}
	conn.Close()
	// The device connected before the rotation still is.
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TLS, addr, trustBoth(dev1)), &paho.Connect{ClientID: "s1-pub", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "devices/sensor-1/x", QoS: 1, Payload: []byte("still here")})
	if m := c1.Next(t); string(m.Payload) != "still here" {
		t.Fatalf("got %q", m.Payload)
	}
	pub.Close()
	poll.Until(t, mqtttest.Timeout, "the broker has seen s1-pub go", func() bool {
		_, ok := b.Server().Clients.Get("s1-pub")
		return !ok
	})

	// Revoking sensor-1 cuts it off and keeps it out.
	b.reload.last.TLSCRL = ca1.CRL(t, "crl.pem", dev1.Cert)
	if res, err = b.Reload(); err != nil {
		t.Fatalf("reload with a CRL: %v", err)
	}
	if !slices.Equal(res.Disconnected, []string{"s1"}) {
		t.Errorf("disconnected %v, want [s1]", res.Disconnected)
	}
	select {
	case <-c1.Done():
	case <-time.After(mqtttest.Timeout):
		t.Fatal("the revoked device is still connected")
	}
	if err := tlsRefused(t, addr, trustBoth(dev1)); err == nil {
		t.Fatal("the revoked device connected again")
	}
}

// TestReloadPasswordFileAndACL changes users and ACL rules under connected
// clients: a removed user is cut off, a subscription the ACL no longer
// allows is removed, a broken file changes nothing; the admin API answers
// 422 for it.
func TestReloadPasswordFileAndACL(t *testing.T) {
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "passwd")
	aliceHash := hashOf(t, "apw")
	writePasswd(t, pwFile, map[string]string{"alice": aliceHash, "bob": hashOf(t, "bpw")})
	acl := `
auth:
  acl:
    - username: alice
      filters:
        "news/#": 1
`
	cfg := testConfig(t)
	cfg.PasswordFile = pwFile
	cfg.HTTPToken = "t0ken"
	source := func() (Config, error) {
		c := cfg
		return c, DecodeConfig([]byte(acl), &c)
	}
	b, connect, alice, bob := startReloadable(t, source)
	if _, err := connect("carol", "carol", "cpw"); err == nil {
		t.Fatal("carol connected before she was added")
	}
	alice.Subscribe(t, paho.SubscribeOptions{Topic: "news/#", QoS: 1}, paho.SubscribeOptions{Topic: "orders/#", QoS: 1})

	reload := func() (int, string) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+b.Addr("http")+adminapi.PathReload, nil)
		req.Header.Set("Authorization", "Bearer t0ken")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	// A password file that does not parse: 422 naming file and line, nothing changes.
	if err := os.WriteFile(pwFile, []byte("alice:"+aliceHash+"\nthis line has no colon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := reload(); code != http.StatusUnprocessableEntity || !strings.Contains(body, pwFile+":2") {
		t.Fatalf("reload of a broken password file: %d %s, want 422 naming %s:2", code, body, pwFile)
	}
	if c, err := connect("bob-2", "bob", "bpw"); err != nil {
		t.Fatalf("bob no longer connects after a failed reload: %v", err)
	} else {
		c.Close()
	}

	// bob removed, carol added, alice (her hash unchanged: a changed one
	// would cut her off too) may read news/# only (orders/# denied), and
	// not news/secret/# (her news/# subscription stays: the fan-out's
	// check of each delivery is what must apply the new rules).
	writePasswd(t, pwFile, map[string]string{"alice": aliceHash, "carol": hashOf(t, "cpw")})
	acl = `
auth:
  acl:
    - username: alice
      filters:
        "news/#": 1
        "news/secret/#": 0
        "orders/#": 0
`
	code, body := reload()
	if code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	var res adminapi.ReloadResult
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Disconnected, []string{"bob"}) || res.Unsubscribed != 1 {
		t.Errorf("reload did %+v, want bob disconnected and one subscription removed", res)
	}
	select {
	case <-bob.Done():
	case <-time.After(mqtttest.Timeout):
		t.Fatal("bob is still connected")
	}
	if _, err := connect("bob-3", "bob", "bpw"); err == nil {
		t.Fatal("bob connected after his removal")
	}
	carol, err := connect("carol", "carol", "cpw")
	if err != nil {
		t.Fatalf("carol: %v", err)
	}
	defer carol.Close()
	carol.Publish(t, &paho.Publish{Topic: "orders/1", QoS: 1, Payload: []byte("o")})
	carol.Publish(t, &paho.Publish{Topic: "news/secret/1", QoS: 1, Payload: []byte("s")})
	carol.Publish(t, &paho.Publish{Topic: "news/1", QoS: 1, Payload: []byte("n")})
	if m := alice.Next(t); m.Topic != "news/1" {
		t.Errorf("alice got %s first, want news/1 (orders/# and news/secret/# are no longer hers)", m.Topic)
	}
	cl, _ := b.Server().Clients.Get("alice")
	if _, ok := cl.State.Subscriptions.Get("orders/#"); ok {
		t.Error("alice still holds orders/#")
	}
	if b.reload.ok.Load() != 1 || b.reload.bad.Load() != 1 {
		t.Errorf("reloads counted ok=%d error=%d, want 1 and 1", b.reload.ok.Load(), b.reload.bad.Load())
	}
	poll.Until(t, mqtttest.Timeout, "metrics show the reloads", func() bool {
		resp, err := http.Get("http://" + b.Addr("http") + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		m, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(m), `keyline_config_reloads_total{result="error"} 1`) &&
			strings.Contains(string(m), `keyline_config_reloads_total{result="ok"} 1`)
	})
}

// TestMosquittoPasswordFile: a file Debian's mosquitto_passwd wrote works unchanged.
func TestMosquittoPasswordFile(t *testing.T) {
	bin, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Skip("mosquitto_passwd not installed (.ci/run installs mosquitto)")
	}
	pwFile := filepath.Join(t.TempDir(), "passwd")
	if out, err := exec.Command(bin, "-c", "-b", pwFile, "device-7", "s3cret").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
	}
	cfg := testConfig(t)
	cfg.PasswordFile = pwFile
	b := startBroker(t, cfg)
	dial := func(pw string) error {
		c, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil), &paho.Connect{ClientID: "d7", CleanStart: true, KeepAlive: 30,
			Username: "device-7", UsernameFlag: true, Password: []byte(pw), PasswordFlag: true})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial("s3cret"); err != nil {
		t.Fatalf("the right password: %v", err)
	}
	if err := dial("wrong"); err == nil {
		t.Fatal("a wrong password connected")
	}
}

func hashOf(t *testing.T, pw string) string {
	t.Helper()
	h, err := passwd.New([]byte(pw), passwd.Argon2id)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// writePasswd writes a password file of user -> hash.
func writePasswd(t *testing.T, path string, users map[string]string) {
	t.Helper()
	var sb strings.Builder
	for u, h := range users {
		sb.WriteString(u + ":" + h + "\n")
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func pemOf(t *testing.T, der []byte) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startReloadable starts a broker whose reloads read source, with alice
// (password apw) and bob (bpw) connected; connect connects another client.
func startReloadable(t *testing.T, source func() (Config, error)) (b *Broker, connect func(id, user, pw string) (*mqtttest.V5, error), alice, bob *mqtttest.V5) {
	t.Helper()
	first, err := source()
	if err != nil {
		t.Fatal(err)
	}
	b = startBroker(t, first)
	b.SetReloadSource(source)
	addr := b.Addr("tcp")
	connect = func(id, user, pw string) (*mqtttest.V5, error) {
		return mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30,
			Username: user, UsernameFlag: true, Password: []byte(pw), PasswordFlag: true})
	}
	for _, c := range []struct {
		v  **mqtttest.V5
		id string
	}{{&alice, "alice"}, {&bob, "bob"}} {
		v, err := connect(c.id, c.id, c.id[:1]+"pw")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(v.Close)
		*c.v = v
	}
	return b, connect, alice, bob
}
