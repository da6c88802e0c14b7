package mqtt

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mochi-mqtt/server/v2/packets"
)

// A publish whose retain flag is for delivery only (PATCHES.md item 22) is
// not stored as the topic's retained message, and a retain-as-published
// subscription still sees the flag.
func TestPatchRetainNotStored(t *testing.T) {
	s := newServer()
	cl := s.NewClient(nil, LocalListener, "relay", true)
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true}, TopicName: "a/b", Payload: []byte("live")}
	pk.Mods.RetainNotStored = true
	require.NoError(t, s.InjectPacket(cl, pk))
	require.Equal(t, 0, s.Topics.Retained.Len(), "a delivery-only retain flag is not stored")

	sub, _, _ := newTestClient()
	sub.Properties.ProtocolVersion = 5
	sub.Net.Conn = nil
	out, _ := s.publishToClient(sub, packets.Subscription{Filter: "a/b", RetainAsPublished: true}, pk)
	require.True(t, out.FixedHeader.Retain)

	pk.Mods.RetainNotStored = false
	require.NoError(t, s.InjectPacket(cl, pk))
	require.Equal(t, 1, s.Topics.Retained.Len(), "without the mod the publish is retained as before")
}
