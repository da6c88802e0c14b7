package mqtttest

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

// TestTryConnectV5KeepsPacketsWholeOverTLS: paho.golang writes a packet in
// several Write calls (header, variable header, properties, payload) and
// from several goroutines (the caller's, its pinger's, its acknowledger's).
// Over a conn without writev (TLS, WebSocket) two packets written at once
// interleave unless the conn is a sync.Locker, which paho then holds around
// each packet. A test that dialled TLS itself and handed the tls.Conn to
// TryConnectV5 once saw its publish arrive as "\xc0\x00from the new CA's
// devi": the pinger's PINGREQ written between the publish's header and
// payload. Two goroutines publish here over a raw tls.Conn; the server
// checks every packet it reads.
func TestTryConnectV5KeepsPacketsWholeOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := NewCA(t, dir, "server")
	leaf := ca.Leaf(t, "broker", LeafOptions{Server: true})
	pair, err := tls.LoadX509KeyPair(leaf.CertFile, leaf.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const perWriter, writers = 300, 2
	payload := bytes.Repeat([]byte("p"), 200)
	verdict := make(chan error, 1)
	go func() { verdict <- serveChecking(ln, perWriter*writers, payload) }()

	conn, err := tls.Dial("tcp", ln.Addr().String(), ClientTLS(t, ca, Leaf{}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := TryConnectV5(conn, &paho.Connect{ClientID: "c", CleanStart: true, KeepAlive: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range perWriter {
				if _, err := c.Client.Publish(t.Context(), &paho.Publish{Topic: "t", Payload: payload}); err != nil {
					return // the server has seen a bad packet and closed: its verdict says which
				}
			}
		})
	}
	if err := <-verdict; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// serveChecking accepts one MQTT 5 client, answers its CONNECT and reads
// want packets, each of which must be a whole PUBLISH of payload on "t" (or
// a PINGREQ, answered).
func serveChecking(ln net.Listener, want int, payload []byte) error {
	conn, err := ln.Accept()
	if err != nil {
		return err
	}
	defer conn.Close()
	if cp, err := packets.ReadPacket(conn); err != nil || cp.Type != packets.CONNECT {
		return fmt.Errorf("first packet: %v %v", cp, err)
	}
	ack := packets.NewControlPacket(packets.CONNACK)
	if _, err := ack.WriteTo(conn); err != nil {
		return err
	}
	for got := 0; got < want; {
		cp, err := packets.ReadPacket(conn)
		if err != nil {
			return fmt.Errorf("after %d publishes: %w", got, err)
		}
		switch p := cp.Content.(type) {
		case *packets.Publish:
			if p.Topic != "t" || !bytes.Equal(p.Payload, payload) {
				return fmt.Errorf("publish %d: topic %q, payload %q", got, p.Topic, p.Payload)
			}
			got++
		case *packets.Pingreq:
			if _, err := packets.NewControlPacket(packets.PINGRESP).WriteTo(conn); err != nil {
				return err
			}
		default:
			return fmt.Errorf("after %d publishes: packet type %d", got, cp.Type)
		}
	}
	return nil
}
