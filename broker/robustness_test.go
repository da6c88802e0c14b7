package broker

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// rawConnect opens a TCP connection and completes an MQTT 3.1.1 CONNECT by hand.
func rawConnect(t *testing.T, addr, clientID string) net.Conn {
	t.Helper()
	c := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
	t.Cleanup(func() { c.Close() })
	body := mqtttest.AppendString(nil, "MQTT")
	body = append(body, 4, 0x02, 0, 60) // level 4, clean session, keepalive 60 s
	body = mqtttest.AppendString(body, clientID)
	pkt := mqtttest.AppendVarint([]byte{0x10}, len(body))
	if _, err := c.Write(append(pkt, body...)); err != nil {
		t.Fatalf("write CONNECT: %v", err)
	}
	ack := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	if _, err := io.ReadFull(c, ack); err != nil || !bytes.Equal(ack, []byte{0x20, 2, 0, 0}) {
		t.Fatalf("CONNACK = %x, %v", ack, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	return c
}

func rawPublish(topic string, payload []byte) []byte {
	body := append(mqtttest.AppendString(nil, topic), payload...)
	return append(mqtttest.AppendVarint([]byte{0x30}, len(body)), body...)
}

// TestBadConnectionsCloseOnlyThemselves sends garbage and oversized packets
// and checks that only the offending connection closes.
func TestBadConnectionsCloseOnlyThemselves(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxPacketSize = 1024
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "bystander", CleanStart: true, KeepAlive: 30})
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "ok/#", QoS: 1})
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "good-publisher", CleanStart: true, KeepAlive: 30})

	bad := map[string]func(t *testing.T) net.Conn{
		"http request instead of CONNECT": func(t *testing.T) net.Conn {
			c := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
			_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
			return c
		},
		"random bytes after CONNECT": func(t *testing.T) net.Conn {
			c := rawConnect(t, addr, "garbage")
			_, _ = c.Write([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02, 0x03})
			return c
		},
		"second CONNECT": func(t *testing.T) net.Conn {
			c := rawConnect(t, addr, "twice")
			body := append(mqtttest.AppendString(nil, "MQTT"), 4, 0x02, 0, 60)
			body = mqtttest.AppendString(body, "twice")
			_, _ = c.Write(append(mqtttest.AppendVarint([]byte{0x10}, len(body)), body...))
			return c
		},
		"publish larger than max-packet-size": func(t *testing.T) net.Conn {
			c := rawConnect(t, addr, "oversized")
			_, _ = c.Write(rawPublish("ok/big", make([]byte, 4096)))
			return c
		},
		"remaining length beyond the protocol's maximum": func(t *testing.T) net.Conn {
			c := rawConnect(t, addr, "malformed-length")
			_, _ = c.Write([]byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x7f})
			return c
		},
	}
	i := 0
	for name, open := range bad {
		t.Run(name, func(t *testing.T) {
			c := open(t)
			if !mqtttest.IsClosed(c) {
				t.Fatal("the broker kept the connection open")
			}
			// Everyone else carries on.
			i++
			want := fmt.Sprintf("after %d", i)
			if rc := pub.Publish(t, &paho.Publish{Topic: "ok/x", QoS: 1, Payload: []byte(want)}); rc != 0 {
				t.Fatalf("publish after bad connection: reason %#x", rc)
			}
			if m := sub.Next(t); string(m.Payload) != want {
				t.Fatalf("bystander got %q, want %q", m.Payload, want)
			}
		})
	}
	// The oversized message must not have been delivered to anyone.
	select {
	case m := <-sub.Msgs:
		t.Fatalf("unexpected delivery %s %d bytes", m.Topic, len(m.Payload))
	default:
	}
}

// TestSessionAndRetainedSurviveGracefulRestart restarts the broker on the same
// data dir. (integration/ does the same with SIGKILL against the binary.)
func TestSessionAndRetainedSurviveGracefulRestart(t *testing.T) {
	cfg := testConfig(t)
	b1, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b1.Start(); err != nil {
		t.Fatal(err)
	}
	addr := b1.Addr("tcp")
	expiry := uint32(3600)
	persistent := &paho.Connect{ClientID: "worker-1", CleanStart: false, KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}
	sub, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), persistent)
	if err != nil {
		t.Fatal(err)
	}
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "jobs/#", QoS: 1})
	sub.Close() // the session stays

	pub, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		pub.Publish(t, &paho.Publish{Topic: "jobs/a", QoS: 1, Payload: fmt.Appendf(nil, "job-%d", i)})
	}
	pub.Publish(t, &paho.Publish{Topic: "config/a", QoS: 1, Retain: true, Payload: []byte("retained-v1")})
	pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b1.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}

	b2 := startBroker(t, cfg) // same data dir
	addr = b2.Addr("tcp")
	resumed := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), persistent)
	if !resumed.Connack.SessionPresent {
		t.Fatal("CONNACK session present = false after restart")
	}
	// mochi resends a resumed session's inflight messages sorted by their
	// creation second, so messages from one second may come in any order.
	got, ids := map[string]bool{}, map[uint16]bool{}
	for range 3 {
		m := resumed.Next(t)
		if m.QoS != 1 || m.PacketID == 0 || ids[m.PacketID] {
			t.Fatalf("resumed session got %q qos %d packet id %d: want QoS 1 and a fresh non-zero packet id", m.Payload, m.QoS, m.PacketID)
		}
		got[string(m.Payload)], ids[m.PacketID] = true, true
	}
	for i := range 3 {
		if want := fmt.Sprintf("job-%d", i); !got[want] {
			t.Fatalf("resumed session got %v, missing %q", got, want)
		}
	}
	fresh := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "reader", CleanStart: true, KeepAlive: 30})
	fresh.Subscribe(t, paho.SubscribeOptions{Topic: "config/#", QoS: 1})
	if m := fresh.Next(t); string(m.Payload) != "retained-v1" || !m.Retain {
		t.Fatalf("retained after restart = %q retain=%v", m.Payload, m.Retain)
	}
}

// TestHTTPHasTimeoutsAndACap: a request whose body never comes holds its
// connection for http-read-timeout at most; a connection past
// http-max-conns closes the oldest one without a request in progress, and
// waits only while every connection has one.
func TestHTTPHasTimeoutsAndACap(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPReadTimeout, cfg.HTTPMaxConns = 300*time.Millisecond, 2
	b := startBroker(t, cfg)
	addr := b.Addr("http")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A POST that announces a body and never sends it: closed by the server.
	slow := dial()
	if _, err := io.WriteString(slow, "POST /api/v1/dlq/purge?group=a/b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(slow); err != nil {
		t.Fatalf("the server did not close a request whose body never came: %v", err)
	}
	get := func(c net.Conn, within time.Duration) (string, error) {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(within))
		return bufio.NewReader(c).ReadString('\n')
	}
	// The server reports the slow connection closed (ConnState) just after
	// it closed it: once it has, two idle keep-alive connections fill the
	// cap, and a third closes the oldest and is served.
	eventually(t, "the closed connection to be forgotten", func() bool { return b.httpConns.count() == 0 })
	var idle []net.Conn
	for range 2 {
		c := dial()
		idle = append(idle, c)
		if _, err := get(c, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if line, err := get(dial(), 10*time.Second); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("past two idle connections: %q %v", line, err)
	}
	if _, err := idle[0].Read(make([]byte, 1)); err == nil {
		t.Fatal("the oldest idle connection was not closed")
	}
	// Two connections with a request in progress (a live topic stream,
	// whose answer has begun): a third waits until one ends.
	var streams []net.Conn
	for range 2 {
		c := dial()
		streams = append(streams, c)
		if line, err := func() (string, error) {
			if _, err := io.WriteString(c, "GET /api/v1/topics/stream?filter=x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
				return "", err
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			return bufio.NewReader(c).ReadString('\n')
		}(); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("topic stream: %q %v", line, err)
		}
	}
	third := dial()
	if _, err := get(third, 200*time.Millisecond); err == nil { // a deliberate wait for nothing: a served request answers within it on loopback
		t.Fatal("a third connection was served while two had requests in progress")
	}
	streams[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(third).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("once a slot was free: %q %v", line, err)
	}
}
