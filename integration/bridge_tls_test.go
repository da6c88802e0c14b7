package integration

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestBridgeOverTLSWithAClientCertificate bridges to a mosquitto that
// requires a client certificate signed by its CA: with the certificate the
// messages cross; without it the bridge reports the TLS refusal and keeps
// the messages queued.
func TestBridgeOverTLSWithAClientCertificate(t *testing.T) {
	ca := mqtttest.NewCA(t, t.TempDir(), "keyline-test")
	srv := ca.Leaf(t, "central", mqtttest.LeafOptions{Server: true})
	cli := ca.Leaf(t, "site-7", mqtttest.LeafOptions{})
	srvCert, srvKey, cliCert, cliKey := srv.CertFile, srv.KeyFile, cli.CertFile, cli.KeyFile
	central := startMosquitto(t, fmt.Sprintf("cafile %s\ncertfile %s\nkeyfile %s\nrequire_certificate true\nuse_identity_as_username true\n", ca.File, srvCert, srvKey))

	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	subTLS := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	got := newSeqCollector()
	sub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TLS, central.addr()), "collector", true, subTLS, func(o *mqtt3.ClientOptions) {
		o.SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) { got.add(string(m.Payload())) })
	})
	sub.Subscribe(t, "site/#", 1)

	for _, proto := range []string{"3.1.1", "5"} {
		flag := bridgeFlag("central", central.addr(), proto, `sensors/# out 1 "" site/`) +
			fmt.Sprintf(" tls.ca-file=%s tls.cert-file=%s tls.key-file=%s", ca.File, cliCert, cliKey)
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
	edge := startKeyline(t, t.TempDir(), "--bridge", bridgeFlag("central", central.addr(), "5", `sensors/# out 1 "" site/`)+" tls.ca-file="+ca.File)
	v := waitBridge(t, edge, "central", "refused", mqtttest.Timeout, func(v adminapi.BridgeView) bool { return v.Failures > 0 })
	if v.State == "connected" || v.Connects != 0 || !strings.Contains(v.LastError, central.addr()) {
		t.Fatalf("without a client certificate: %+v, want refused with the address in the error", v)
	}
	pub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, edge.addrs["tcp"]), "device", true, nil)
	pub.Publish(t, "sensors/t", 1, false, []byte("k0:9"))
	waitBridge(t, edge, "central", "queueing", mqtttest.Timeout, func(v adminapi.BridgeView) bool { return v.QueuedMessages == 1 })
}
