// Package mqtttest holds helpers for tests that drive a broker with real
// MQTT clients: paho.golang for MQTT 5, paho.mqtt.golang for MQTT 3.1.1.
// Nothing here sleeps: waits are on channels with a deadline.
package mqtttest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/gorilla/websocket"
)

// Timeout bounds every wait in these helpers.
const Timeout = 10 * time.Second

// Transport names how a client reaches the broker.
type Transport string

const (
	TCP Transport = "tcp"
	TLS Transport = "tls"
	WS  Transport = "ws"
	WSS Transport = "wss" // WebSocket over TLS
)

// Dial opens a raw connection to addr over transport. tlsConf is used for TLS.
func Dial(t testing.TB, transport Transport, addr string, tlsConf *tls.Config) net.Conn {
	t.Helper()
	var (
		c   net.Conn
		err error
	)
	switch transport {
	case TCP:
		c, err = net.DialTimeout("tcp", addr, Timeout)
	case TLS:
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: Timeout}, Config: tlsConf}
		c, err = d.Dial("tcp", addr)
	case WS, WSS:
		d := websocket.Dialer{Subprotocols: []string{"mqtt"}, HandshakeTimeout: Timeout, TLSClientConfig: tlsConf}
		var ws *websocket.Conn
		ws, _, err = d.Dial(string(transport)+"://"+addr+"/", http.Header{})
		if err == nil {
			c = &wsConn{Conn: ws.UnderlyingConn(), ws: ws}
		}
	default:
		t.Fatalf("unknown transport %q", transport)
	}
	if err != nil {
		t.Fatalf("dial %s %s: %v", transport, addr, err)
	}
	// paho.golang writes one packet in several Write calls and from several
	// goroutines; it holds the conn's lock around a packet when it has one.
	return packets.NewThreadSafeConn(c)
}

// wsConn is a client-side WebSocket connection as a net.Conn.
type wsConn struct {
	net.Conn
	ws  *websocket.Conn
	rmu sync.Mutex
	buf []byte
	wmu sync.Mutex
}

func (c *wsConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.buf) == 0 {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			return 0, err
		}
		c.buf = data
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsConn) Close() error { return c.ws.Close() }

// V5 is a connected MQTT 5 client whose received messages arrive on Msgs.
type V5 struct {
	*paho.Client
	Msgs    chan *paho.Publish
	Connack *paho.Connack
	t       testing.TB
}

// ConnectV5 connects an MQTT 5 client over conn. It is disconnected in t.Cleanup.
func ConnectV5(t testing.TB, conn net.Conn, cp *paho.Connect) *V5 {
	t.Helper()
	c, err := TryConnectV5(conn, cp)
	if err != nil {
		t.Fatalf("connect %s: %v", cp.ClientID, err)
	}
	c.t = t
	t.Cleanup(c.Close)
	return c
}

// TryConnectV5 is ConnectV5 that returns the error (a refused CONNACK
// included) instead of failing the test. The caller closes the client.
func TryConnectV5(conn net.Conn, cp *paho.Connect) (*V5, error) {
	if _, ok := conn.(sync.Locker); !ok {
		// paho writes one packet in several Write calls and from several
		// goroutines (the caller's, its pinger's, its acknowledger's): over
		// a conn without writev (TLS, WebSocket) their packets interleave
		// unless paho can hold the conn's lock around each (as Dial's are).
		conn = packets.NewThreadSafeConn(conn)
	}
	c := &V5{Msgs: make(chan *paho.Publish, 10000)}
	c.Client = paho.NewClient(paho.ClientConfig{
		ClientID: cp.ClientID,
		Conn:     conn,
		// The caller's context bounds each request. paho's default (10 s)
		// cut longer ones short whatever the context said: a cluster
		// publish may take up to cluster.DefaultPublishTimeout (15 s) while
		// JetStream elects a new stream leader, and TestClusterNATSServerKilled
		// failed once under load with "context deadline exceeded" after 10 s
		// of its 30 s.
		PacketTimeout: time.Minute,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			c.Msgs <- r.Packet
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	ca, err := c.Client.Connect(ctx, cp)
	c.Connack = ca
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return c, nil
}

// Close disconnects the client and waits for its goroutines.
func (c *V5) Close() {
	select {
	case <-c.Client.Done():
		return
	default:
	}
	_ = c.Client.Disconnect(&paho.Disconnect{ReasonCode: 0})
	<-c.Client.Done()
}

// Subscribe subscribes and returns the SUBACK reason codes (errors included).
func (c *V5) Subscribe(t testing.TB, subs ...paho.SubscribeOptions) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	sa, err := c.Client.Subscribe(ctx, &paho.Subscribe{Subscriptions: subs})
	if sa == nil {
		t.Fatalf("subscribe: %v", err)
	}
	return sa.Reasons
}

// Publish publishes and returns the reason code of the PUBACK/PUBREC/PUBCOMP
// (0 for QoS 0).
func (c *V5) Publish(t testing.TB, p *paho.Publish) byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	pr, err := c.Client.Publish(ctx, p)
	if pr == nil {
		if err != nil {
			t.Fatalf("publish %s: %v", p.Topic, err)
		}
		return 0
	}
	return pr.ReasonCode
}

// Next returns the next received message or fails after Timeout.
func (c *V5) Next(t testing.TB) *paho.Publish {
	t.Helper()
	select {
	case m := <-c.Msgs:
		return m
	case <-time.After(Timeout):
		t.Fatalf("no message within %v", Timeout)
		return nil
	}
}

// V3 is a connected MQTT 3.1.1 client whose received messages arrive on Msgs
// (from every subscription, and from a resumed session).
type V3 struct {
	mqtt3.Client
	Msgs chan mqtt3.Message
}

// V3URL returns the paho.mqtt.golang broker URL for transport and addr.
func V3URL(transport Transport, addr string) string {
	switch transport {
	case TLS:
		return "ssl://" + addr
	case WS:
		return "ws://" + addr + "/"
	case WSS:
		return "wss://" + addr + "/"
	}
	return "tcp://" + addr
}

// ConnectV3 connects an MQTT 3.1.1 client. It is disconnected in t.Cleanup.
func ConnectV3(t testing.TB, url, clientID string, clean bool, tlsConf *tls.Config, opts ...func(*mqtt3.ClientOptions)) *V3 {
	t.Helper()
	c := &V3{Msgs: make(chan mqtt3.Message, 10000)}
	o := mqtt3.NewClientOptions().
		AddBroker(url).
		SetClientID(clientID).
		SetProtocolVersion(4).
		SetCleanSession(clean).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetOrderMatters(true).
		SetConnectTimeout(Timeout).
		SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) { c.Msgs <- m })
	if tlsConf != nil {
		o.SetTLSConfig(tlsConf)
	}
	for _, f := range opts {
		f(o)
	}
	c.Client = mqtt3.NewClient(o)
	if tok := c.Client.Connect(); !tok.WaitTimeout(Timeout) || tok.Error() != nil {
		t.Fatalf("connect %s to %s: %v", clientID, url, tok.Error())
	}
	t.Cleanup(func() { c.Client.Disconnect(0) })
	return c
}

// Subscribe subscribes with the default handler and returns the granted QoS
// (0x80 on refusal).
func (c *V3) Subscribe(t testing.TB, filter string, qos byte) byte {
	t.Helper()
	tok := c.Client.Subscribe(filter, qos, nil)
	if !tok.WaitTimeout(Timeout) {
		t.Fatalf("subscribe %s: no SUBACK within %v", filter, Timeout)
	}
	res := tok.(*mqtt3.SubscribeToken).Result()
	qos, ok := res[filter]
	if !ok && len(res) == 1 { // paho keys a $share/<g>/<f> result by <f>
		for _, q := range res {
			qos, ok = q, true
		}
	}
	if !ok {
		t.Fatalf("subscribe %s: SUBACK result %v has no entry for the filter (error %v)", filter, res, tok.Error())
	}
	return qos
}

// Publish publishes and waits for the flow to complete.
func (c *V3) Publish(t testing.TB, topic string, qos byte, retain bool, payload []byte) {
	t.Helper()
	tok := c.Client.Publish(topic, qos, retain, payload)
	if !tok.WaitTimeout(Timeout) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

// Next returns the next received message or fails after Timeout.
func (c *V3) Next(t testing.TB) mqtt3.Message {
	t.Helper()
	select {
	case m := <-c.Msgs:
		return m
	case <-time.After(Timeout):
		t.Fatalf("no message within %v", Timeout)
		return nil
	}
}

// IsClosed reports whether reading conn ends (EOF or reset) within Timeout,
// reading and discarding whatever the broker sends before closing.
func IsClosed(conn net.Conn) bool {
	_ = conn.SetReadDeadline(time.Now().Add(Timeout))
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			return !errors.As(err, &ne) || !ne.Timeout()
		}
	}
}

// SelfSigned writes a fresh self-signed certificate for 127.0.0.1 and
// localhost into dir and returns the file paths and a client TLS config that
// trusts it.
func SelfSigned(t testing.TB, dir string) (certFile, keyFile string, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "keyline test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}
