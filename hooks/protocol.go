package hooks

import (
	"errors"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/conform"
)

// Protocol corrects packets mochi writes against the protocol, as they are
// encoded:
//   - an MQTT 3.1.1 (or 3.1) CONNACK carries one of 3.1.1's return codes, 0
//     to 5 (conform.Connack311): mochi passes MQTT 5 reason codes through,
//     such as 0x80 for an empty client id with clean session 0, which 3.1.1
//     answers with 0x02 (identifier rejected) [MQTT-3.1.3-8]. A CONNECT that
//     breaks the protocol gets no CONNACK: the connection is closed
//     [MQTT-3.1.4-1];
//   - a SUBACK or UNSUBACK does not carry the user properties of the
//     SUBSCRIBE or UNSUBSCRIBE it answers (mochi copies them over);
//   - a PUBLISH keeps its user properties when the client set Request
//     Problem Information to 0, which concerns the other packets only
//     [MQTT-3.1.2-29] (mochi dropped them from the QoS 1/2 deliveries it
//     encodes; Keyline's own encoders keep them).
//
// With MaxKeepAlive set, an MQTT 5 client that asks for a longer keep alive,
// or for none, is given MaxKeepAlive in the CONNACK's Server Keep Alive
// [MQTT-3.2.2-21]; MQTT 3.1.1 cannot be told, so its clients keep theirs.
//
// The protocol errors mochi's decoder lets through are found before mochi
// reads the packet, by internal/conform's Checker on the connection.
type Protocol struct {
	mqtt.HookBase
	// MaxKeepAlive is the longest keep alive, in seconds, an MQTT 5 client
	// may use (0: the client's own, whatever it is).
	MaxKeepAlive uint16
}

// ID returns the hook's id.
func (h *Protocol) ID() string { return "keyline-protocol" }

// Provides reports which hook methods Protocol implements.
func (h *Protocol) Provides(b byte) bool {
	return b == mqtt.OnConnect && h.MaxKeepAlive > 0
}

// OnConnect lowers an MQTT 5 client's keep alive to MaxKeepAlive; mochi
// arms the connection's read deadline with it and sends it in the CONNACK.
func (h *Protocol) OnConnect(cl *mqtt.Client, _ packets.Packet) error {
	if max := h.MaxKeepAlive; max > 0 && cl.Properties.ProtocolVersion >= 5 && (cl.State.Keepalive == 0 || cl.State.Keepalive > max) {
		cl.State.Keepalive, cl.State.ServerKeepalive = max, true
	}
	return nil
}

// errNoConnack ends a 3.1.1 connection whose CONNECT broke the protocol.
var errNoConnack = errors.New("MQTT 3.1.1 CONNECT breaks the protocol: closed without CONNACK")

// EncodePacket (a PacketEncoder step) corrects CONNACK, SUBACK, UNSUBACK
// and PUBLISH packets.
func (h *Protocol) EncodePacket(cl *mqtt.Client, pk *packets.Packet) {
	switch pk.FixedHeader.Type {
	case packets.Publish:
		pk.Mods.DisallowProblemInfo = false
	case packets.Suback, packets.Unsuback:
		pk.Properties.User = nil
	case packets.Connack:
		if cl.Properties.ProtocolVersion >= 5 || pk.ReasonCode <= conform.Return311NotAuthorized {
			break
		}
		var send bool
		switch {
		case pk.ReasonCode == packets.ErrUnspecifiedError.Code && !cl.Properties.Clean && cl.Properties.Props.AssignedClientID != "":
			// validateConnect's code for an empty client id with clean
			// session 0 (mochi assigned the id before it checked).
			pk.ReasonCode, send = conform.Return311IdentifierRejected, true
		case pk.Properties.ReasonString == packets.ErrProtocolViolationProtocolVersion.Reason:
			pk.ReasonCode, send = conform.Return311BadProtocolVersion, true // [MQTT-3.1.2-2]
		default:
			pk.ReasonCode, send = conform.Connack311(pk.ReasonCode)
		}
		if !send {
			h.Log.Info("closing an MQTT 3.1.1 connection without CONNACK: its CONNECT breaks the protocol",
				"client", clip(cl.ID), "remote", cl.Net.Remote, "reason", pk.Properties.ReasonString)
			cl.Stop(errNoConnack) // the CONNACK below finds the connection closed and is not sent
		}
	}
}
