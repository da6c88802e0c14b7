package hooks

import (
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// refuseSubscription turns filter i of a SUBSCRIBE that mochi has granted into
// a refusal with code before the SUBACK goes out. mochi calls OnSubscribed
// with the SUBACK's own reason codes (so the change reaches the client) after
// it added the subscription, which is taken back here. MQTT 3.1.1 has one
// failure code, 0x80. Hooks after this one see the failure code and skip the
// filter.
func refuseSubscription(s *mqtt.Server, cl *mqtt.Client, filter string, codes []byte, i int, code packets.Code) {
	if i >= len(codes) || codes[i] >= packets.ErrUnspecifiedError.Code {
		return
	}
	if cl.Properties.ProtocolVersion < 5 {
		code = packets.ErrUnspecifiedError
	}
	codes[i] = code.Code
	cl.State.Subscriptions.Delete(filter)
	if s.Topics.Unsubscribe(filter, cl.ID) {
		atomic.AddInt64(&s.Info.Subscriptions, -1)
	}
}

// refuseConnect answers a CONNECT with a CONNACK of code (code311 for MQTT
// 3.1.1) and closes the connection with err.
func refuseConnect(cl *mqtt.Client, code, code311 packets.Code, err error) {
	if cl.Properties.ProtocolVersion < 5 {
		code = code311
	}
	_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, ReasonCode: code.Code})
	cl.Stop(err)
}
