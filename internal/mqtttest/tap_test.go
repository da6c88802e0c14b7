package mqtttest_test

import (
	"io"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// TestTap feeds a tapped connection frames split at every byte and checks
// that each PUBLISH is reported once, whole, in order, and nothing else is.
func TestTap(t *testing.T) {
	for _, version := range []byte{mqttwire.Version311, mqttwire.Version5} {
		var stream []byte
		stream = mqttwire.AppendPublish(stream, version, &mqttwire.Publish{Topic: "a", Payload: []byte("one")})
		stream = mqttwire.AppendAck(stream, mqttwire.TypePuback, 1, 0)
		stream = mqttwire.AppendPublish(stream, version, &mqttwire.Publish{Topic: "b/c", QoS: 1, PacketID: 2,
			Props: mqttwire.Properties{User: []mqttwire.UserProperty{{Key: "key", Value: "k"}}}, Payload: make([]byte, 200)})
		stream = mqttwire.AppendPublish(stream, version, &mqttwire.Publish{Topic: "d", QoS: 2, PacketID: 3})

		client, server := net.Pipe()
		var got []string
		tapped := mqtttest.Tap(client, version, func(topic string, payload []byte) {
			got = append(got, topic+":"+string(payload[:min(len(payload), 3)]))
		})
		errc := make(chan error, 1)
		go func() {
			defer server.Close()
			for i := range stream {
				if _, err := server.Write(stream[i : i+1]); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		if b, err := io.ReadAll(tapped); err != nil || len(b) != len(stream) {
			t.Fatalf("v%d: read %d of %d bytes: %v", version, len(b), len(stream), err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("v%d: write: %v", version, err)
		}
		if want := []string{"a:one", "b/c:\x00\x00\x00", "d:"}; !slices.Equal(got, want) {
			t.Errorf("v%d: tapped %q, want %q", version, got, want)
		}
		client.Close()
	}
}

// lockConn is a net.Conn with a write lock that records being taken.
type lockConn struct {
	net.Conn
	sync.Mutex
	locks int
}

func (c *lockConn) Lock() { c.Mutex.Lock(); c.locks++ }

// TestTapKeepsThePacketLock: paho.golang writes a packet in several Writes
// and PINGREQs from another goroutine, taking the conn's lock around each
// packet when the conn has one; a tap over such a conn must hand it on (a
// PINGREQ once landed inside a SUBSCRIBE and the broker refused it).
func TestTapKeepsThePacketLock(t *testing.T) {
	inner := &lockConn{}
	c := mqtttest.Tap(inner, 5, func(string, []byte) {})
	l, ok := c.(sync.Locker)
	if !ok {
		t.Fatal("the tap is not a sync.Locker")
	}
	l.Lock()
	l.Unlock()
	if inner.locks != 1 {
		t.Fatalf("the wrapped conn's lock was taken %d times, want 1", inner.locks)
	}
	if _, ok := mqtttest.Tap(nil, 5, nil).(sync.Locker); !ok {
		t.Fatal("a tap over a conn without a lock has none")
	}
}
