package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// PacketEncoder is the one hook that provides OnPacketEncode: it runs the
// other hooks' corrections to a packet mochi is about to write (their
// EncodePacket methods) on the packet in place, in this order:
//   - Auth drops from a resumed session's inflight state what its user may
//     no longer read, when the CONNACK goes out (mochi resends it next);
//   - Retained fails the ack of a publish whose retained message was not
//     stored;
//   - Cluster refuses the CONNACK of a session whose ownership is unsettled;
//   - Protocol maps CONNACK codes for MQTT 3.1.1 (after every step that may
//     set one) and strips what mochi adds to SUBACK, UNSUBACK, PUBLISH;
//   - Fanout attaches the session on a successful CONNACK and marks acks
//     for the short encoding, last: after every step that may change an ack.
//
// mochi copies the packet (several hundred bytes) into and out of every
// hook that provides OnPacketEncode, for every packet it writes (PUBACKs to
// publishers, CONNACK, SUBACK, ...), as it did for OnPacketRead
// (PacketReader). The calls are direct, so the packet stays on the stack.
type PacketEncoder struct {
	mqtt.HookBase
	Auth     *Auth     // nil: skipped (and skipped without auth)
	Retained *Retained // nil: skipped
	Cluster  *Cluster  // nil: skipped (single node)
	Protocol *Protocol // nil: skipped
	Fanout   *Fanout   // nil: skipped
}

// ID returns the hook's id.
func (h *PacketEncoder) ID() string { return "keyline-packet-encode" }

// Provides reports that PacketEncoder implements OnPacketEncode only.
func (h *PacketEncoder) Provides(b byte) bool { return b == mqtt.OnPacketEncode }

// OnPacketEncode runs the hooks' EncodePacket on pk, in order.
func (h *PacketEncoder) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if h.Auth != nil && (pk.FixedHeader.Type == packets.Connack || h.Auth.rules.Configured()) {
		h.Auth.EncodePacket(cl, &pk)
	}
	if h.Retained != nil {
		h.Retained.EncodePacket(cl, &pk)
	}
	if h.Cluster != nil {
		h.Cluster.EncodePacket(cl, &pk)
	}
	if h.Protocol != nil {
		h.Protocol.EncodePacket(cl, &pk)
	}
	if h.Fanout != nil {
		h.Fanout.EncodePacket(cl, &pk)
	}
	return pk
}
