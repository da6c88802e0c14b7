package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Observe hands every publish, after mochi and the other hooks have routed
// it, to an observer that is not part of routing (the operator's topic
// streams, package broker/ops). mochi asks Provides before every call, so
// OnPublished is provided only while Watching reports true: without a
// viewer a publish costs the observer one atomic load, not a call.
type Observe struct {
	mqtt.HookBase
	// Watching reports whether anyone is looking.
	Watching func() bool
	// Published receives a publish; it must not keep topic or payload (views
	// into the packet) and must not block.
	Published func(topic string, qos byte, retain bool, payload []byte)
}

// ID names the hook.
func (h *Observe) ID() string { return "keyline-observe" }

// Provides reports OnPublished while someone is watching.
func (h *Observe) Provides(b byte) bool { return b == mqtt.OnPublished && h.Watching() }

// OnPublished hands the publish to the observer.
func (h *Observe) OnPublished(_ *mqtt.Client, pk packets.Packet) {
	h.Published(pk.TopicName, pk.FixedHeader.Qos, pk.FixedHeader.Retain, pk.Payload)
}
