package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// testCA is a certificate authority for one test: it signs a server
// certificate for 127.0.0.1 and client certificates.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA's PEM certificate
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	ca := &testCA{dir: t.TempDir()}
	var der []byte
	ca.key, der = ca.issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "keyline test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
	var err error
	if ca.cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	ca.file = ca.write(t, "ca.pem", "CERTIFICATE", der)
	return ca
}

// issue creates a certificate from tmpl, signed by the CA (self-signed when
// the CA has no key yet), and returns its key and DER bytes.
func (ca *testCA) issue(t *testing.T, tmpl *x509.Certificate, _ any) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	parent, signer := tmpl, key
	if ca.cert != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func (ca *testCA) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// leaf issues a certificate named name (server: for 127.0.0.1) and returns
// its certificate and key files.
func (ca *testCA) leaf(t *testing.T, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	key, der := ca.issue(t, tmpl, nil)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return ca.write(t, name+".pem", "CERTIFICATE", der), ca.write(t, name+".key", "PRIVATE KEY", kder)
}

// TestBridgeOverTLSWithAClientCertificate bridges to a mosquitto that
// requires a client certificate signed by its CA: with the certificate the
// messages cross; without it the bridge reports the TLS refusal and keeps
// the messages queued.
func TestBridgeOverTLSWithAClientCertificate(t *testing.T) {
	ca := newTestCA(t)
	srvCert, srvKey := ca.leaf(t, "central", true)
	cliCert, cliKey := ca.leaf(t, "site-7", false)
	central := startMosquitto(t, fmt.Sprintf("cafile %s\ncertfile %s\nkeyfile %s\nrequire_certificate true\nuse_identity_as_username true\n", ca.file, srvCert, srvKey))

	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	subTLS := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	got := newSeqCollector()
	sub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TLS, central.addr()), "collector", true, subTLS, func(o *mqtt3.ClientOptions) {
		o.SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) { got.add(string(m.Payload())) })
	})
	sub.Subscribe(t, "site/#", 1)

	for _, proto := range []string{"3.1.1", "5"} {
		flag := bridgeFlag("central", central.addr(), proto, `sensors/# out 1 "" site/`) +
			fmt.Sprintf(" tls.ca-file=%s tls.cert-file=%s tls.key-file=%s", ca.file, cliCert, cliKey)
		edge := startKeyline(t, t.TempDir(), "--bridge", flag)
		waitBridge(t, edge, "central", "connected over TLS", mqtttest.Timeout, bridgeUp)
		pub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, edge.addrs["tcp"]), "device", true, nil)
		seq := map[string]int{"3.1.1": 0, "5": 1}[proto]
		pub.Publish(t, "sensors/t", 1, false, fmt.Appendf(nil, "k0:%d", seq))
		pub.Disconnect(0)
		got.wait(t, seq+1, mqtttest.Timeout)
		edge.signal(t, 9)
	}

	// No client certificate: mosquitto refuses it (with TLS 1.3 after the
	// client's side of the handshake, so the bridge sees the connection reset).
	edge := startKeyline(t, t.TempDir(), "--bridge", bridgeFlag("central", central.addr(), "5", `sensors/# out 1 "" site/`)+" tls.ca-file="+ca.file)
	v := waitBridge(t, edge, "central", "refused", mqtttest.Timeout, func(v adminapi.BridgeView) bool { return v.Failures > 0 })
	if v.State == "connected" || v.Connects != 0 || !strings.Contains(v.LastError, central.addr()) {
		t.Fatalf("without a client certificate: %+v, want refused with the address in the error", v)
	}
	pub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, edge.addrs["tcp"]), "device", true, nil)
	pub.Publish(t, "sensors/t", 1, false, []byte("k0:9"))
	waitBridge(t, edge, "central", "queueing", mqtttest.Timeout, func(v adminapi.BridgeView) bool { return v.QueuedMessages == 1 })
}
