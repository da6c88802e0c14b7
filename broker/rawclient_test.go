package broker

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// rawClient is an MQTT 3.1.1 or 5 client whose packets the test writes and
// reads one by one (encoded and decoded with mochi's packet codec): it
// decides when to read, what to acknowledge, and sees ids, DUP flags and
// properties as they are on the wire.
type rawClient struct {
	t       *testing.T
	c       net.Conn
	r       *bufio.Reader
	version byte
	nextID  uint16
}

// rawOptions are the CONNECT settings of a rawClient.
type rawOptions struct {
	version       byte // 4 or 5
	clean         bool
	sessionExpiry uint32
	topicAliasMax uint16
	receiveMax    uint16
	user          []packets.UserProperty
	// username and password, sent when not empty.
	username, password string
	// willTopic, when set, is the topic of a QoS 0 will (payload "gone").
	willTopic string
	// rcvbuf, when set, is the socket's receive buffer: a client that does
	// not read then stalls the broker's writer after that many bytes.
	rcvbuf int
}

func dialRaw(t *testing.T, addr, clientID string, o rawOptions) (*rawClient, packets.Packet) {
	t.Helper()
	rc, ack := dialRawAck(t, addr, clientID, o)
	if ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v reason %#x", ack.FixedHeader, ack.ReasonCode)
	}
	return rc, ack
}

// dialRawAck is dialRaw that returns whatever CONNACK the broker sent.
func dialRawAck(t *testing.T, addr, clientID string, o rawOptions) (*rawClient, packets.Packet) {
	t.Helper()
	d := net.Dialer{Timeout: mqtttest.Timeout}
	if o.rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, o.rcvbuf)
			})
			return errors.Join(err, serr)
		}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &rawClient{t: t, c: c, r: bufio.NewReader(c), version: o.version}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: o.version,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: clientID, Clean: o.clean, Keepalive: 60}}
	if o.username != "" {
		pk.Connect.Username, pk.Connect.UsernameFlag = []byte(o.username), true
	}
	if o.password != "" {
		pk.Connect.Password, pk.Connect.PasswordFlag = []byte(o.password), true
	}
	if o.willTopic != "" {
		pk.Connect.WillFlag, pk.Connect.WillTopic, pk.Connect.WillPayload = true, o.willTopic, []byte("gone")
	}
	if o.version == 5 {
		pk.Properties.SessionExpiryInterval, pk.Properties.SessionExpiryIntervalFlag = o.sessionExpiry, o.sessionExpiry > 0
		pk.Properties.TopicAliasMaximum = o.topicAliasMax
		pk.Properties.ReceiveMaximum = o.receiveMax
		pk.Properties.User = o.user
	}
	rc.send(pk)
	return rc, rc.next()
}

func (rc *rawClient) send(pk packets.Packet) {
	rc.t.Helper()
	pk.ProtocolVersion = rc.version
	pk.Mods.AllowResponseInfo = true
	var buf bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&buf)
	case packets.Subscribe:
		err = pk.SubscribeEncode(&buf)
	case packets.Publish:
		err = pk.PublishEncode(&buf)
	case packets.Puback:
		err = pk.PubackEncode(&buf)
	case packets.Pubrec:
		err = pk.PubrecEncode(&buf)
	case packets.Pubcomp:
		err = pk.PubcompEncode(&buf)
	case packets.Disconnect:
		err = pk.DisconnectEncode(&buf)
	}
	if err != nil {
		rc.t.Fatal(err)
	}
	if _, err := rc.c.Write(buf.Bytes()); err != nil {
		rc.t.Fatalf("write %v: %v", pk.FixedHeader.Type, err)
	}
}

// next reads and decodes one packet.
func (rc *rawClient) next() packets.Packet {
	rc.t.Helper()
	pk, err := rc.read(mqtttest.Timeout)
	if err != nil {
		rc.t.Fatalf("read: %v", err)
	}
	return pk
}

func (rc *rawClient) read(timeout time.Duration) (packets.Packet, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(timeout))
	defer rc.c.SetReadDeadline(time.Time{})
	b, err := rc.r.ReadByte()
	if err != nil {
		return packets.Packet{}, err
	}
	pk := packets.Packet{ProtocolVersion: rc.version}
	if err := pk.FixedHeader.Decode(b); err != nil {
		return pk, err
	}
	n, _, err := packets.DecodeLength(rc.r)
	if err != nil {
		return pk, err
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(rc.r, body); err != nil {
		return pk, err
	}
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Suback:
		err = pk.SubackDecode(body)
	case packets.Pubrel:
		err = pk.PubrelDecode(body)
	}
	return pk, err
}

// nextPublish reads packets until a PUBLISH.
func (rc *rawClient) nextPublish() packets.Packet {
	rc.t.Helper()
	for {
		if pk := rc.next(); pk.FixedHeader.Type == packets.Publish {
			return pk
		}
	}
}

func (rc *rawClient) subscribe(filter string, qos byte) {
	rc.t.Helper()
	rc.nextID++
	rc.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, PacketID: rc.nextID,
		Filters: packets.Subscriptions{{Filter: filter, Qos: qos}}})
	if ack := rc.next(); ack.FixedHeader.Type != packets.Suback || len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != qos {
		rc.t.Fatalf("SUBACK %+v", ack)
	}
}

// ack answers a QoS 1 or 2 publish (PUBACK, or PUBREC then, on the broker's
// PUBREL, PUBCOMP).
func (rc *rawClient) ack(pk packets.Packet) {
	rc.t.Helper()
	switch pk.FixedHeader.Qos {
	case 1:
		rc.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID})
	case 2:
		rc.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: pk.PacketID})
		if rel := rc.next(); rel.FixedHeader.Type != packets.Pubrel || rel.PacketID != pk.PacketID {
			rc.t.Fatalf("after PUBREC %d: %v %d, want PUBREL", pk.PacketID, rel.FixedHeader.Type, rel.PacketID)
		}
		rc.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubcomp}, PacketID: pk.PacketID})
	}
}

func userProperty(pk packets.Packet, key string) (string, bool) {
	for _, u := range pk.Properties.User {
		if u.Key == key {
			return u.Val, true
		}
	}
	return "", false
}
