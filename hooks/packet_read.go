package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// PacketReader is the one hook that provides OnPacketRead: it runs the
// other hooks' reactions to a packet a client sent (Auth, KeyShared, Fanout:
// their ReadPacket methods), in order, on the packet in place. mochi copies
// the packet (several hundred bytes) into and out of every hook that
// provides OnPacketRead, for every packet of every client: with three such
// hooks that was 13% of the broker's CPU in a profile of QoS 1 fan-out to
// 100 subscribers, most of it copying.
type PacketReader struct {
	mqtt.HookBase
	steps []func(*mqtt.Client, *packets.Packet)
}

// NewPacketReader returns a hook that runs steps, in order, for every packet read.
func NewPacketReader(steps ...func(*mqtt.Client, *packets.Packet)) *PacketReader {
	return &PacketReader{steps: steps}
}

// ID returns the hook's id.
func (h *PacketReader) ID() string { return "keyline-packet-read" }

// Provides reports that PacketReader implements OnPacketRead only.
func (h *PacketReader) Provides(b byte) bool { return b == mqtt.OnPacketRead }

// OnPacketRead runs the steps on pk.
func (h *PacketReader) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	for _, step := range h.steps {
		step(cl, &pk)
	}
	return pk, nil
}
