package hooks

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// RetainedStore is where a deployment's retained messages live: one per
// topic, on one node in its data file (NewBoltRetained), in a cluster in
// the stream KL_RETAINED that every node follows (NewClusterRetained). The
// Retained hook drives it and never asks which one it has.
//
// A store is made with an apply function: the local retained index (mochi's).
// The contract, which hooks/retainedtest checks against every
// implementation:
//
//   - Opening: before the constructor returns, apply has been called with
//     the retained message of every topic the deployment holds (the last
//     one stored per topic; none that has expired by its message expiry
//     interval).
//   - Retain stores pk as its topic's retained message, replacing the one
//     before (an empty payload deletes it), and returns once it is durable
//     (the data file committed; JetStream stored on a quorum): the
//     publisher's acknowledgement waits for it, and a store that fails says
//     so (the publisher is refused). pk's topic, payload, QoS and MQTT 5
//     properties come back as they were given.
//   - Follow: after opening, apply gets every change stored through another
//     store of the deployment (another node), in the deployment's store
//     order, on one goroutine of the store, never concurrently; changes
//     through this store may come back too, in the same order (applying one
//     again changes nothing: the local index already took it). Deletions
//     come as packets with an empty payload.
//   - CatchUp returns once apply has had every change stored anywhere in
//     the deployment before the call (a subscription made after a retained
//     publish was acknowledged on another node gets it), or ctx ended.
//   - Expired tells the store that the local index dropped topic's message
//     as expired: it is not applied again at the next opening.
//
// All methods are safe for concurrent use.
type RetainedStore interface {
	Retain(ctx context.Context, pk packets.Packet) error
	CatchUp(ctx context.Context) error
	Expired(topic string)
}

// RetainTimeout bounds how long a publisher's acknowledgement waits for its
// retained message to be stored.
const RetainTimeout = 10 * time.Second

// Retained is the mochi glue of the retained store, in both modes: it
// stores every retained message mochi takes (or refuses the publish),
// drops what mochi expires, and makes a SUBSCRIBE wait until what the
// deployment retained before it is in the local index.
type Retained struct {
	mqtt.HookBase
	server *mqtt.Server
	store  RetainedStore
	// skip reports the clients whose retained messages are not this
	// node's to store (in a cluster: what other nodes sent; nil: none).
	skip func(*mqtt.Client) bool

	// failed holds the publishes whose retained message could not be
	// stored, until their acknowledgement is encoded (as a failure).
	failed sync.Map // packetKey -> struct{}
	// failures counts failed's entries (at least), so that the acks of
	// every other publish skip the lookup.
	failures atomic.Int64
}

// NewRetained returns the retained hook of server. Give it its store with
// SetStore before the server serves.
func NewRetained(server *mqtt.Server) *Retained { return &Retained{server: server} }

// SetStore gives the hook its store; skip (nil: none) names the clients
// whose retained messages are not the deployment's (in a cluster, the
// node's injections of what other nodes sent: they stored it).
func (h *Retained) SetStore(s RetainedStore, skip func(*mqtt.Client) bool) {
	h.store, h.skip = s, skip
}

// Apply puts pk into the local retained index (an empty payload deletes
// the topic's): the apply function of the hook's store.
func (h *Retained) Apply(pk packets.Packet) {
	pk.FixedHeader.Retain = true
	pk.FixedHeader.Qos = min(pk.FixedHeader.Qos, 2)
	h.server.Topics.RetainMessage(pk)
	atomic.StoreInt64(&h.server.Info.Retained, int64(h.server.Topics.Retained.Len()))
}

// ID returns the hook's id.
func (h *Retained) ID() string { return "keyline-retained" }

// Provides reports which hook methods Retained implements.
func (h *Retained) Provides(b byte) bool { return retainedEvents.has(b) }

var retainedEvents = eventSet(mqtt.OnRetainMessage, mqtt.OnRetainedExpired, mqtt.OnSubscribe)

// OnRetainMessage stores a retained message (or its deletion) and waits
// until it is durable, so the publisher's PUBACK means every node and a
// restart keep it. When it cannot be stored the PUBACK/PUBREC mochi is
// about to send says 0x80 (MQTT 5), or the 3.1.1 publisher is disconnected
// without one.
func (h *Retained) OnRetainMessage(cl *mqtt.Client, pk packets.Packet, _ int64) {
	if h.skip != nil && h.skip(cl) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), RetainTimeout)
	err := h.store.Retain(ctx, pk)
	cancel()
	if err == nil {
		return
	}
	h.Log.Error("retained message not stored; the publish is refused", "client", clip(cl.ID), "topic", clip(pk.TopicName), "error", err)
	if cl.Net.Inline || pk.FixedHeader.Qos == 0 {
		return
	}
	if cl.Properties.ProtocolVersion < 5 {
		cl.Stop(err) // 3.1.1 cannot refuse a publish
		return
	}
	h.failed.Store(packetKey{cl.ID, pk.PacketID}, struct{}{})
	h.failures.Add(1)
}

// packetKey names one packet id of one client.
type packetKey struct {
	client string
	id     uint16
}

// EncodePacket (a PacketEncoder step) turns the acknowledgement of a publish
// whose retained message was not stored into a failure (0x80).
func (h *Retained) EncodePacket(cl *mqtt.Client, pk *packets.Packet) {
	if t := pk.FixedHeader.Type; (t == packets.Puback || t == packets.Pubrec) && h.failures.Load() > 0 {
		if _, failed := h.failed.LoadAndDelete(packetKey{cl.ID, pk.PacketID}); failed {
			h.failures.Add(-1)
			pk.ReasonCode = packets.ErrUnspecifiedError.Code
		}
	}
}

// OnRetainedExpired tells the store that mochi expired a retained message.
func (h *Retained) OnRetainedExpired(topic string) { h.store.Expired(topic) }

// OnSubscribe waits, for a SUBSCRIBE with non-shared filters that take
// retained messages, until what the deployment retained before it is in
// the local index (at most two seconds), so it gets what another node
// retained just before.
func (h *Retained) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if cl.Net.Inline {
		return pk
	}
	for _, f := range pk.Filters {
		if !mqtt.IsSharedFilter(f.Filter) && f.RetainHandling != 2 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := h.store.CatchUp(ctx); err != nil {
				h.Log.Debug("retained messages may lag behind", "error", err)
			}
			cancel()
			break
		}
	}
	return pk
}
