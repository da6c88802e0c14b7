package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// readToEOF returns what the broker sends on c until it closes c, failing the
// test if it does not within mqtttest.Timeout.
func readToEOF(t *testing.T, c net.Conn) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("the broker did not close the connection: %v (after % x)", err, b)
	}
	return b
}

// TestConnack311ReturnCodes: an MQTT 3.1.1 CONNACK carries one of the six
// return codes 3.1.1 has, and a CONNECT that breaks the protocol is closed
// without one.
func TestConnack311ReturnCodes(t *testing.T) {
	addr := startBroker(t, testConfig(t)).Addr("tcp")
	frame, str, u16 := mqtttest.Frame, mqtttest.Str, mqtttest.U16
	for _, tc := range []struct {
		name    string
		connect []byte
		want    []byte // all the broker sends before it closes
	}{
		{"empty client id with clean session 0", mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version311, KeepAlive: 30}),
			[]byte{0x20, 2, 0, 0x02}}, // identifier rejected [MQTT-3.1.3-8]; mochi wrote 0x80
		{"protocol level 3 named MQTT", frame(mqttwire.TypeConnect, 0, str("MQTT"), []byte{3, 0x02}, u16(30), str("old")),
			[]byte{0x20, 2, 0, 0x01}}, // unacceptable protocol version [MQTT-3.1.2-2]; mochi wrote 0x82
		{"reserved connect flag set", frame(mqttwire.TypeConnect, 0, str("MQTT"), []byte{4, 0x03}, u16(30), str("reserved")),
			nil}, // [MQTT-3.1.2-3], [MQTT-3.1.4-1]: no CONNACK; mochi wrote 0x82
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
			defer c.Close()
			write(t, c, tc.connect)
			if got := readToEOF(t, c); !slices.Equal(got, tc.want) {
				t.Fatalf("the broker sent % x, want % x", got, tc.want)
			}
		})
	}
}

// TestProtocolErrorsCloseOnlyTheOffender sends, for every packet a client
// sends, a frame with a property twice (and CONNECTs with Receive Maximum or
// Maximum Packet Size 0): the broker answers DISCONNECT 0x82 (CONNACK 0x82
// to a CONNECT) with a Reason String naming the property, after answering
// what came before it, and closes; the offender's will goes out; everyone
// else carries on.
func TestProtocolErrorsCloseOnlyTheOffender(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	bystander := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "bystander", CleanStart: true, KeepAlive: 30})
	bystander.Subscribe(t, paho.SubscribeOptions{Topic: "ok/#", QoS: 1}, paho.SubscribeOptions{Topic: "will/#", QoS: 1})
	cases := mqtttest.ProtocolErrors()
	for i, bad := range cases {
		t.Run(bad.Name, func(t *testing.T) {
			c := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
			defer c.Close()
			r := mqttwire.NewReader(c, 0)
			_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
			if bad.IsConnect() {
				write(t, c, bad.Frame)
				connack, err := r.Next()
				ack, derr := mqttwire.DecodeConnack(mqttwire.Version5, connack)
				if err != nil || derr != nil || ack.ReasonCode != 0x82 || reasonString(t, ack.Props) != bad.Reason {
					t.Fatalf("CONNACK %+v (%v, %v), want 0x82 %q", ack, err, derr, bad.Reason)
				}
			} else {
				id := "offender-" + bad.Name
				connect5(t, c, r, mqtttest.Connect5(id, nil, mqtttest.Props())) // with a will
				// A good QoS 1 publish and the bad frame in one write: the
				// publish is answered, then the bad frame.
				good := mqttwire.AppendPublish(nil, mqttwire.Version5, &mqttwire.Publish{Topic: "ok/before", QoS: 1, PacketID: 77, Payload: []byte(bad.Name)})
				write(t, c, slices.Concat(good, bad.Frame))
				p, err := r.Next()
				if ack, derr := mqttwire.DecodeAck(mqttwire.Version5, p); err != nil || derr != nil || p.Type != mqttwire.TypePuback || ack.PacketID != 77 {
					t.Fatalf("want the PUBACK of the publish before the bad frame, got %+v (%v, %v)", p, err, derr)
				}
				expectDisconnect(t, r, bad.Reason)
				// The publish and the will (QoS 1 and QoS 0: two paths, in either order).
				got := map[string]string{}
				for range 2 {
					m := bystander.Next(t)
					got[m.Topic] = string(m.Payload)
				}
				if got["ok/before"] != bad.Name || got["will/"+id] != "gone" {
					t.Fatalf("bystander got %q, want the publish before the bad frame and the offender's will", got)
				}
			}
			if _, err := r.Next(); !errors.Is(err, io.EOF) {
				t.Fatalf("after the refusal: %v, want the connection closed", err)
			}
			// Everyone else carries on.
			want := "after " + bad.Name
			if rc := bystander.Publish(t, &paho.Publish{Topic: "ok/after", QoS: 1, Payload: []byte(want)}); rc != 0 {
				t.Fatalf("publish after the bad connection: reason %#x", rc)
			}
			if m := bystander.Next(t); string(m.Payload) != want {
				t.Fatalf("bystander got %q, want %q", m.Payload, want)
			}
			if n := b.connStats.ProtocolErrors.Load(); n != uint64(i+1) {
				t.Fatalf("keyline_conn_protocol_errors_total = %d, want %d", n, i+1)
			}
		})
	}
}

// TestProtocolErrorsOnEveryListener: the check runs on TCP, TLS and
// WebSocket connections alike.
func TestProtocolErrorsOnEveryListener(t *testing.T) {
	cfg := testConfig(t)
	cfg.WS, cfg.TLS = "127.0.0.1:0", "127.0.0.1:0"
	var clientTLS *tls.Config
	cfg.TLSCert, cfg.TLSKey, clientTLS = mqtttest.SelfSigned(t, t.TempDir())
	b := startBroker(t, cfg)
	dup := mqtttest.PropU16(mqttwire.PropTopicAlias, 1)
	bad := mqtttest.Frame(mqttwire.TypePublish, 0, mqtttest.Str("a/b"), mqtttest.Props(dup, dup), []byte("x"))
	for _, tr := range []mqtttest.Transport{mqtttest.TCP, mqtttest.TLS, mqtttest.WS} {
		t.Run(string(tr), func(t *testing.T) {
			c := mqtttest.Dial(t, tr, b.Addr(string(tr)), clientTLS)
			defer c.Close()
			r := mqttwire.NewReader(c, 0)
			_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
			connect5(t, c, r, mqtttest.Connect5("over-"+string(tr), nil, nil))
			write(t, c, bad)
			expectDisconnect(t, r, "PUBLISH: Topic Alias (0x23) appears more than once")
			if !mqtttest.IsClosed(c) {
				t.Fatal("the broker kept the connection open")
			}
		})
	}
}

func write(t *testing.T, c net.Conn, frame []byte) {
	t.Helper()
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
}

// connect5 sends an MQTT 5 CONNECT and expects a successful CONNACK.
func connect5(t *testing.T, c net.Conn, r *mqttwire.Reader, connect []byte) {
	t.Helper()
	write(t, c, connect)
	p, err := r.Next()
	if ack, derr := mqttwire.DecodeConnack(mqttwire.Version5, p); err != nil || derr != nil || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v (%v, %v)", ack, err, derr)
	}
}

// expectDisconnect reads a DISCONNECT 0x82 with Reason String reason.
func expectDisconnect(t *testing.T, r *mqttwire.Reader, reason string) {
	t.Helper()
	p, err := r.Next()
	d, derr := mqttwire.DecodeDisconnect(mqttwire.Version5, p)
	if err != nil || derr != nil || d.ReasonCode != 0x82 || reasonString(t, d.Props) != reason {
		t.Fatalf("DISCONNECT %+v (%v, %v), want 0x82 %q", d, err, derr, reason)
	}
}

func reasonString(t *testing.T, r mqttwire.RawProperties) string {
	t.Helper()
	p, err := r.Parse()
	if err != nil {
		t.Fatal(err)
	}
	return p.ReasonString
}

// TestRealClientsAreNotRefused runs the packets paho.golang sends, with
// properties that may repeat (user properties) and those that may not,
// once each, through every kind of packet: no connection is refused;
// SUBACK and UNSUBACK do not echo the user properties of the SUBSCRIBE and
// UNSUBSCRIBE (mochi copied them); and deliveries at every QoS keep their
// user properties although paho asks for no problem information (mochi
// dropped them at QoS 1 and 2).
func TestRealClientsAreNotRefused(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	receiveMax, packetMax, expiry := uint16(10), uint32(1<<20), uint32(60)
	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{
		ClientID: "real", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &receiveMax, MaximumPacketSize: &packetMax, SessionExpiryInterval: &expiry,
			User: paho.UserProperties{{Key: "a", Value: "1"}, {Key: "a", Value: "2"}}},
	})
	users := paho.UserProperties{{Key: "trace", Value: "t1"}, {Key: "trace", Value: "t2"}}
	subID := 9
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	sa, err := c.Client.Subscribe(ctx, &paho.Subscribe{
		Subscriptions: []paho.SubscribeOptions{{Topic: "real/#", QoS: 2}},
		Properties:    &paho.SubscribeProperties{SubscriptionIdentifier: &subID, User: users},
	})
	if err != nil || !slices.Equal(sa.Reasons, []byte{2}) {
		t.Fatalf("SUBACK %+v, %v", sa, err)
	}
	if sa.Properties != nil && len(sa.Properties.User) > 0 {
		t.Fatalf("SUBACK carries user properties %v: they were the SUBSCRIBE's", sa.Properties.User)
	}
	for qos := range byte(3) { // QoS 2 runs PUBREC, PUBREL and PUBCOMP both ways
		msgExpiry := uint32(60)
		if rc := c.Publish(t, &paho.Publish{Topic: "real/x", QoS: qos, Payload: []byte{qos},
			Properties: &paho.PublishProperties{MessageExpiry: &msgExpiry, ContentType: "text/plain", User: users}}); rc != 0 {
			t.Fatalf("QoS %d publish: reason %#x", qos, rc)
		}
		if m := c.Next(t); m.QoS != qos || len(m.Properties.User) != 2 {
			t.Fatalf("got QoS %d with user properties %v", m.QoS, m.Properties.User)
		}
	}
	ua, err := c.Client.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"real/#"}, Properties: &paho.UnsubscribeProperties{User: users}})
	if err != nil || !slices.Equal(ua.Reasons, []byte{0}) {
		t.Fatalf("UNSUBACK %+v, %v", ua, err)
	}
	if ua.Properties != nil && len(ua.Properties.User) > 0 {
		t.Fatalf("UNSUBACK carries user properties %v: they were the UNSUBSCRIBE's", ua.Properties.User)
	}
	zero := uint32(0)
	if err := c.Client.Disconnect(&paho.Disconnect{ReasonCode: 0, Properties: &paho.DisconnectProperties{SessionExpiryInterval: &zero, User: users}}); err != nil {
		t.Fatal(err)
	}
	<-c.Client.Done()
	if n := b.connStats.ProtocolErrors.Load(); n != 0 {
		t.Fatalf("%d connections refused for a protocol error", n)
	}
}
