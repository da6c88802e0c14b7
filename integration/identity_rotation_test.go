package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/golang-jwt/jwt/v5"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// tlsHandshakeRefused dials addr with conf, sends a CONNECT and reports the
// error the handshake or the first read ends with (in TLS 1.3 the server's
// verdict on a client certificate comes after the client's handshake); nil
// if the broker answered.
func tlsHandshakeRefused(t *testing.T, addr string, conf *tls.Config) error {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: mqtttest.Timeout}, "tcp", addr, conf)
	if err != nil {
		return err
	}
	defer c.Close()
	_, _ = c.Write(mqtttest.Connect5("probe", nil, nil))
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	_, err = c.Read(make([]byte, 64))
	return err
}

// concatFiles writes the files' contents, one after another, to dst.
func concatFiles(t *testing.T, dst string, srcs ...string) {
	t.Helper()
	var all []byte
	for _, s := range srcs {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if err := os.WriteFile(dst, all, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBinaryRefusesUntrustedAndExpiredCertificates: the binary requiring
// client certificates refuses, in the TLS handshake and on both the tls and
// wss listeners, a certificate of a CA it does not trust and an expired one
// of its own CA, counting each by reason, while a valid one connects.
func TestBinaryRefusesUntrustedAndExpiredCertificates(t *testing.T) {
	dir := t.TempDir()
	serverCA, devices := mqtttest.NewCA(t, dir, "server"), mqtttest.NewCA(t, dir, "devices")
	srv := serverCA.Leaf(t, "broker", mqtttest.LeafOptions{Server: true})
	good := devices.Leaf(t, "sensor-1", mqtttest.LeafOptions{})
	expired := devices.Leaf(t, "sensor-old", mqtttest.LeafOptions{NotAfter: time.Now().Add(-time.Hour)})
	stranger := mqtttest.NewCA(t, t.TempDir(), "elsewhere").Leaf(t, "sensor-1", mqtttest.LeafOptions{})
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--tls", "127.0.0.1:0", "--wss", "127.0.0.1:0",
		"--tls-cert", srv.CertFile, "--tls-key", srv.KeyFile,
		"--tls-client-ca", devices.File, "--tls-client-auth", "require", "--tls-identity", "cn")

	for _, tc := range []struct {
		name, reason string
		leaf         mqtttest.Leaf
	}{{"an expired certificate", "expired", expired}, {"a certificate of another CA", "untrusted", stranger}} {
		for _, l := range []string{"tls", "wss"} {
			if err := tlsHandshakeRefused(t, p.addrs[l], mqtttest.ClientTLS(t, serverCA, tc.leaf)); err == nil {
				t.Errorf("%s connected on %s", tc.name, l)
			} else {
				t.Logf("%s on %s: %v", tc.name, l, err)
			}
		}
		p.waitMetric(t, `keyline_tls_client_certificates_refused_total{reason="`+tc.reason+`"}`, 2)
	}
	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TLS, p.addrs["tls"], mqtttest.ClientTLS(t, serverCA, good)),
		&paho.Connect{ClientID: "s1", CleanStart: true, KeepAlive: 30})
	if rc := c.Publish(t, &paho.Publish{Topic: "devices/sensor-1/t", QoS: 1, Payload: []byte("1")}); rc != 0 {
		t.Errorf("the valid device's publish: %#x", rc)
	}
	c.Close()
}

// TestBinaryRotatesClientCA rotates the devices' CA of a running binary
// with SIGHUP: a bundle holding the old and the new CA lets the new CA's
// devices in while the old CA's connected device keeps its connection (and
// the old CA's devices still connect); a bundle of the new CA alone then
// refuses the old CA's new handshakes, and connections made before keep
// theirs (as the README says: a reload applies to handshakes after it).
func TestBinaryRotatesClientCA(t *testing.T) {
	dir := t.TempDir()
	serverCA := mqtttest.NewCA(t, dir, "server")
	oldCA, newCA := mqtttest.NewCA(t, dir, "devices-2025"), mqtttest.NewCA(t, dir, "devices-2026")
	srv := serverCA.Leaf(t, "broker", mqtttest.LeafOptions{Server: true})
	oldDev, oldDev2 := oldCA.Leaf(t, "sensor-1", mqtttest.LeafOptions{}), oldCA.Leaf(t, "sensor-3", mqtttest.LeafOptions{})
	newDev := newCA.Leaf(t, "sensor-2", mqtttest.LeafOptions{})
	bundle := filepath.Join(dir, "client-ca.pem")
	concatFiles(t, bundle, oldCA.File)
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--tls", "127.0.0.1:0",
		"--tls-cert", srv.CertFile, "--tls-key", srv.KeyFile,
		"--tls-client-ca", bundle, "--tls-client-auth", "require", "--tls-identity", "cn")
	addr := p.addrs["tls"]
	dial := func(leaf mqtttest.Leaf, id string) (*mqtttest.V5, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: mqtttest.Timeout}, "tcp", addr, mqtttest.ClientTLS(t, serverCA, leaf))
		if err != nil {
			return nil, err
		}
		return mqtttest.TryConnectV5(c, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
	}
	old, err := dial(oldDev, "s1")
	if err != nil {
		t.Fatalf("the old CA's device: %v", err)
	}
	defer old.Close()
	sub := old.Subscribe(t, paho.SubscribeOptions{Topic: "fleet/#", QoS: 1})
	if sub[0] != 1 {
		t.Fatalf("SUBACK %#x", sub[0])
	}
	if err := tlsHandshakeRefused(t, addr, mqtttest.ClientTLS(t, serverCA, newDev)); err == nil {
		t.Fatal("the new CA's device connected before the rotation")
	}
	reloads := 0.0
	reload := func() {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		reloads++
		p.waitMetric(t, `keyline_config_reloads_total{result="ok"}`, reloads)
	}
	roundTrip := func(from *mqtttest.V5, payload string) {
		t.Helper()
		if rc := from.Publish(t, &paho.Publish{Topic: "fleet/x", QoS: 1, Payload: []byte(payload)}); rc != 0 {
			t.Fatalf("publish %q: %#x", payload, rc)
		}
		if m := old.Next(t); string(m.Payload) != payload {
			t.Fatalf("the old CA's device got %q, want %q", m.Payload, payload)
		}
	}

	// Both CAs: the new device connects, the old one kept its connection.
	concatFiles(t, bundle, oldCA.File, newCA.File)
	reload()
	nw, err := dial(newDev, "s2")
	if err != nil {
		t.Fatalf("the new CA's device after the rotation: %v", err)
	}
	defer nw.Close()
	roundTrip(nw, "from the new CA's device")
	old2, err := dial(oldDev2, "s3")
	if err != nil {
		t.Fatalf("another old CA device with both CAs in the bundle: %v", err)
	}
	old2.Close()

	// The new CA alone: the old CA's new handshakes are refused.
	concatFiles(t, bundle, newCA.File)
	reload()
	if err := tlsHandshakeRefused(t, addr, mqtttest.ClientTLS(t, serverCA, oldDev2)); err == nil {
		t.Error("the old CA's device connected after its CA left the bundle")
	}
	p.waitMetric(t, `keyline_tls_client_certificates_refused_total{reason="untrusted"}`, 2)
	roundTrip(nw, "after the old CA left")
	select {
	case <-old.Done():
		t.Error("the old CA's connected device was dropped by a reload")
	default:
	}
}

// TestBinaryJWTExpiry: a client of the binary whose token expires is
// disconnected with 0xA0 (Maximum connect time) and counted; a client with a
// longer token keeps its connection.
func TestBinaryJWTExpiry(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "jwt.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	token := func(sub string, exp time.Time) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": sub, "exp": exp.Unix()}).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--jwt-key", keyFile)
	addr := p.addrs["tcp"]
	long, err := mqtttest.DialWorker(addr, "long", mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30, Password: token("app-1", time.Now().Add(time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	// A deliberate wall-clock wait: exp is in whole seconds and the broker's
	// timer runs on the wall clock, so the token expires 2 to 3 s from now.
	short, err := mqtttest.DialWorker(addr, "short", mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30, Password: token("app-2", time.Now().Add(2*time.Second))})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	select {
	case <-short.Done():
	case <-time.After(mqtttest.Timeout):
		t.Fatal("still connected after its token expired")
	}
	var de *mqtttest.DisconnectError
	if err := short.Err(); !errors.As(err, &de) || de.ReasonCode != 0xA0 {
		t.Errorf("the expired client saw %v, want DISCONNECT 0xA0", err)
	}
	p.waitMetric(t, "keyline_jwt_expired_disconnects_total", 1)
	if rc, err := long.Publish("apps/app-1", []byte("still here"), 1); err != nil || rc != 0 {
		t.Errorf("the long-lived client after the other's expiry: %#x %v", rc, err)
	}
	if _, err := mqtttest.DialWorker(addr, "late", mqtttest.WorkerOptions{CleanStart: true, Password: token("app-3", time.Now().Add(-time.Minute))}); err == nil {
		t.Error("an expired token connected")
	}
}
