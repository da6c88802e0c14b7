package hooks

import (
	"errors"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestFanoutInlinePublishes: an inline client's QoS 0 publish (a message
// from another node) is routed from the cached routes, like a client's;
// its QoS 1/2 publishes go mochi's way, so that every hook's
// OnSelectSubscribers chooses among the sessions (the cluster's keeps a
// queued message from a session that has it already).
func TestFanoutInlinePublishes(t *testing.T) {
	server := mqtt.New(&mqtt.Options{InlineClient: true})
	h := NewFanout(server, FanoutConfig{SharedElsewhere: true})
	inline := server.NewClient(nil, "local", "inline", true)
	device := server.NewClient(nil, "t", "dev", false)
	for _, tc := range []struct {
		cl     *mqtt.Client
		qos    byte
		routed bool
	}{
		{inline, 0, true},
		{inline, 1, false},
		{inline, 2, false},
		{device, 0, true},
		{device, 1, true},
	} {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: tc.qos}, TopicName: "a/b", Payload: []byte("x"), PacketID: 1}
		_, err := h.OnPublish(tc.cl, pk)
		if routed := errors.Is(err, packets.CodeSuccessIgnore); routed != tc.routed {
			t.Errorf("%s's QoS %d publish: routed by the fan-out %v (%v), want %v", tc.cl.ID, tc.qos, routed, err, tc.routed)
		}
	}
}
