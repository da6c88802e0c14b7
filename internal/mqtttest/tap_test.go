package mqtttest_test

import (
	"io"
	"net"
	"slices"
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
