package hooks

import (
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/share"
)

// BridgeMark keeps a bridge's own messages from being sent back to it: a
// client whose CONNECT carried mosquitto's bridge mark (protocol level 0x83
// or 0x84, try_private; the mochi fork reads it as ConnectParams.Bridge)
// gets No Local on its subscriptions, as mosquitto gives its bridges. MQTT
// 3.1.1 has no No Local of its own, so without this a 3.1.1 bridge gets back
// every message it publishes on topics it also subscribes to.
type BridgeMark struct {
	mqtt.HookBase
	marked sync.Map // *mqtt.Client -> struct{}: connections that carried the mark
}

// ID returns the hook's id.
func (h *BridgeMark) ID() string { return "keyline-bridge-mark" }

// Provides reports which hook methods BridgeMark implements.
func (h *BridgeMark) Provides(b byte) bool { return bridgeMarkEvents.has(b) }

var bridgeMarkEvents = eventSet(mqtt.OnConnect, mqtt.OnSubscribe, mqtt.OnDisconnect)

// OnConnect notes a marked connection.
func (h *BridgeMark) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	if pk.Connect.Bridge {
		h.marked.Store(cl, struct{}{})
	}
	return nil
}

// OnSubscribe sets No Local on a marked client's subscriptions (not on
// shared ones, where MQTT 5 forbids it and Key-Shared delivers anyway to
// one member only).
func (h *BridgeMark) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if _, ok := h.marked.Load(cl); !ok {
		return pk
	}
	for i := range pk.Filters {
		if !share.IsShared(pk.Filters[i].Filter) {
			pk.Filters[i].NoLocal = true
		}
	}
	return pk
}

// OnDisconnect forgets the connection.
func (h *BridgeMark) OnDisconnect(cl *mqtt.Client, _ error, _ bool) { h.marked.Delete(cl) }
