package hooks

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/connq"
)

// forwardNode is what the forwarder needs of the cluster node.
type forwardNode interface {
	// Publish sends a message to the other nodes (QoS 1/2: stored in
	// KL_MSGS, returning its sequence).
	Publish(ctx context.Context, topic string, qos byte, body []byte) (uint64, error)
	// NewStorer returns the store pipeline of one client connection; idle
	// (may be nil) is called each time it has handed back every result
	// that is in (cluster.Node.NewPublisher).
	NewStorer(idle func()) storer
	// QueuedPosition is the highest KL_MSGS sequence the node has read.
	QueuedPosition() uint64
}

// storer stores one client's QoS 1/2 publishes in order (cluster.Publisher).
type storer interface {
	Store(topic string, body []byte, done func(seq uint64, err error))
}

// injector puts a packet into mochi as if an inline client published it
// (*mqtt.Server).
type injector interface {
	InjectPacket(cl *mqtt.Client, pk packets.Packet) error
}

// clusterNode adapts *cluster.Node to the small interfaces the cluster
// hook's parts depend on.
type clusterNode struct{ *cluster.Node }

func (n clusterNode) NewStorer(idle func()) storer { return n.NewPublisher(idle) }

// forwarder carries messages between this node and the others: it sends
// local publishes and wills out (storing QoS 1/2 ones before mochi
// acknowledges them), injects what other nodes send, and knows which
// KL_MSGS sequences are in the middle of being delivered here (a session's
// floor stays below them: bound). It owns no lock: its state is in
// sync.Maps and atomics, one entry per publishing client or store.
type forwarder struct {
	node   forwardNode // set by Cluster.SetNode
	inject injector
	log    func() *slog.Logger
	stats  *ClusterStats

	inlineCore, inlineQueued *mqtt.Client

	// injectSeq is the KL_MSGS sequence of the queued message being injected
	// (one goroutine injects queued messages).
	injectSeq atomic.Uint64
	// pubSeq: publishing client id -> KL_MSGS sequence of the publish it is
	// in the middle of (stored, not yet delivered locally).
	pubSeq sync.Map
	// storing: *storeTicket -> a sequence every client store in flight
	// will be at or above (bound keeps floors below it).
	storing sync.Map
	// publishers: *mqtt.Client -> its *clientStores.
	publishers sync.Map
}

// publish forwards a publish from a local client to the other nodes (the
// cluster hook's OnPublish).
func (f *forwarder) publish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline && !forwardedInline(cl.ID) {
		return pk, nil // the broker's own ($SYS) or from another node; dead letters and bridged messages go to every node
	}
	body, err := encodeEnvelope(pk)
	if err != nil {
		f.log().Warn("cluster: not forwarding a publish", "topic", pk.TopicName, "error", err)
		return pk, nil
	}
	if pk.FixedHeader.Qos > 0 && !cl.Net.Inline {
		return pk, f.storeDeferred(cl, pk, body)
	}
	// QoS 0 is one core NATS publish, never waited for: no deadline (its
	// timer was 6% of the publishing node's CPU in a QoS 0 fan-out).
	ctx := context.Background()
	if pk.FixedHeader.Qos > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cluster.DefaultPublishTimeout+time.Second)
		defer cancel()
	}
	seq, err := f.node.Publish(ctx, pk.TopicName, pk.FixedHeader.Qos, body)
	if err != nil {
		if pk.FixedHeader.Qos == 0 {
			f.log().Debug("cluster: QoS 0 publish not forwarded", "topic", pk.TopicName, "error", err)
			return pk, nil
		}
		return pk, f.refuseStore(cl, pk, err)
	}
	f.stats.Forwarded.Add(1)
	if seq > 0 {
		f.pubSeq.Store(cl.ID, seq) // OnQosPublish ties local deliveries to it
	}
	return pk, nil
}

// storeTicket marks a client's store in flight (forwarder.storing).
type storeTicket struct{}

// storeDeferred starts a QoS 1/2 publish's store on the client's publisher
// and defers the publish until it answers.
func (f *forwarder) storeDeferred(cl *mqtt.Client, pk packets.Packet, body []byte) error {
	v, ok := f.publishers.Load(cl)
	if !ok {
		cs := &clientStores{q: queueOf(cl)}
		cs.storer = f.node.NewStorer(cs.flush)
		v, _ = f.publishers.LoadOrStore(cl, cs)
	}
	cs := v.(*clientStores)
	d := mqtt.DeferPublish()
	t := new(storeTicket)
	// The message will be above every sequence the node has read so far:
	// no session's floor passes it until its local deliveries are recorded.
	f.storing.Store(t, f.node.QueuedPosition()+1)
	cs.Store(pk.TopicName, body, func(seq uint64, err error) {
		cs.cork()
		if err != nil {
			f.storing.Delete(t)
			d.Resume(f.refuseStore(cl, pk, err))
			return
		}
		f.stats.Forwarded.Add(1)
		f.pubSeq.Store(cl.ID, seq) // OnQosPublish ties local deliveries to it
		f.storing.Delete(t)
		// Resume runs the rest of the publish here, in the client's order,
		// and OnPublished clears pubSeq; or, when the store was
		// acknowledged before mochi took d in (a fast store), the rest runs
		// on the client's reader once it does, and pubSeq must stay for it
		// (cleared there, or by OnDisconnect): cleared here, that run's
		// local deliveries would hold no session's floor.
		if d.Resume(nil) {
			f.pubSeq.CompareAndDelete(cl.ID, seq) // a publish that ended before OnPublished
		}
	})
	return d
}

// clientStores is one client's store pipeline, and the cork on its
// connection while the pipeline hands back a run of results: the PUBACKs of
// stores JetStream answered together leave in one writev (profile of one
// publisher with 20 in flight: a write(2) per PUBACK was a fifth of the
// publishing node's CPU).
type clientStores struct {
	storer
	q     *connq.Conn // nil: not a queued connection, nothing to cork
	corks atomic.Int32
}

// cork holds the connection's writes back until the next flush.
func (c *clientStores) cork() {
	if c.q != nil {
		c.q.Cork() // before counting it: a flush undoes only corks made
		c.corks.Add(1)
	}
}

// flush undoes the corks (the pipeline's idle callback).
func (c *clientStores) flush() {
	if n := c.corks.Swap(0); n > 0 {
		c.q.Uncork(int(n))
	}
}

// refuseStore answers a QoS 1/2 publish that could not be stored.
func (f *forwarder) refuseStore(cl *mqtt.Client, pk packets.Packet, err error) error {
	f.stats.ForwardErrors.Add(1)
	f.log().Warn("cluster: QoS 1/2 publish not stored; refusing it", "topic", pk.TopicName, "client", cl.ID, "error", err)
	if cl.Properties.ProtocolVersion == 5 {
		return packets.ErrUnspecifiedError
	}
	cl.Stop(fmt.Errorf("cluster: message not stored: %w", err))
	return packets.ErrRejectPacket
}

// published ends a publish: its local deliveries are all recorded.
func (f *forwarder) published(cl *mqtt.Client, pk packets.Packet) {
	// A QoS 0 publish has no sequence, and may end while one of the
	// client's deferred QoS 1/2 publishes is being delivered.
	if pk.FixedHeader.Qos > 0 && (!cl.Net.Inline || forwardedInline(cl.ID)) {
		f.pubSeq.Delete(cl.ID)
	}
}

// disconnected forgets what the forwarder holds for a client going away.
func (f *forwarder) disconnected(cl *mqtt.Client) {
	if v, ok := f.pubSeq.Load(cl.ID); ok && cl.Closed() {
		// A publish cut short (its PUBACK could not be written) never
		// reached OnPublished: do not let it hold every floor back.
		f.pubSeq.CompareAndDelete(cl.ID, v)
	}
	f.publishers.Delete(cl) // its stores in flight keep it until they end
}

// forwardWill sends a will mochi delivered locally to the other nodes.
func (f *forwarder) forwardWill(cl *mqtt.Client, pk packets.Packet) {
	body, err := encodeEnvelope(pk)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), cluster.DefaultPublishTimeout+time.Second)
		_, err = f.node.Publish(ctx, pk.TopicName, pk.FixedHeader.Qos, body)
		cancel()
	}
	if err != nil {
		f.log().Warn("cluster: will not forwarded", "client", cl.ID, "topic", pk.TopicName, "error", err)
		return
	}
	f.stats.Forwarded.Add(1)
}

// deliver injects a message from another node into mochi, which delivers it
// to the local subscribers (the fan-out hook takes QoS 0 deliveries). It
// does not come back to OnPublish's forwarding, and Key-Shared groups do
// not take it (they are per node).
func (f *forwarder) deliver(in cluster.Incoming) {
	pk, err := decodeEnvelope(in.Data)
	if err != nil {
		f.log().Warn("cluster: dropping a malformed message", "error", err)
		return
	}
	if !remainingExpiry(&pk, time.Now()) {
		f.stats.Expired.Add(1)
		return
	}
	// Retained state comes from the retained stream, in its order; a live
	// copy must not overwrite it (it may be older than what the stream holds).
	// Its retain flag stays for delivery: retain-as-published subscribers
	// see it set, as they do on one node [MQTT-3.3.1-12].
	pk.Mods.RetainNotStored = true
	cl := f.inlineCore
	if in.Queued {
		cl = f.inlineQueued
		f.injectSeq.Store(in.Seq)
		defer f.injectSeq.Store(0)
	}
	if err := f.inject.InjectPacket(cl, pk); err != nil {
		f.log().Warn("cluster: delivering a message from another node", "topic", pk.TopicName, "error", err)
		return
	}
	f.stats.Injected.Add(1)
	f.stats.Delivered.Add(1)
}

// ref is the KL_MSGS sequence of a publish being delivered here (the
// fan-out's MessageRef): the one being injected for a message from another
// node, the stored one for a local QoS 1/2 publish; 0 for the rest.
func (f *forwarder) ref(pk packets.Packet) uint64 {
	switch pk.Origin {
	case clusterQueuedClient:
		return f.injectSeq.Load()
	case clusterCoreClient, clusterSysClient:
		return 0
	}
	if v, ok := f.pubSeq.Load(pk.Origin); ok {
		return v.(uint64)
	}
	return 0
}

// bound lowers covered below every sequence being stored or delivered here
// (a session's floor may not pass them).
func (f *forwarder) bound(covered uint64) uint64 {
	f.pubSeq.Range(func(_, v any) bool {
		if seq := v.(uint64); seq > 0 && seq-1 < covered {
			covered = seq - 1
		}
		return true
	})
	f.storing.Range(func(_, v any) bool {
		if seq := v.(uint64); seq-1 < covered {
			covered = seq - 1
		}
		return true
	})
	if inj := f.injectSeq.Load(); inj > 0 && inj-1 < covered {
		covered = inj - 1
	}
	return covered
}

// injects reports whether cl is one of the forwarder's inline clients.
func (f *forwarder) injects(cl *mqtt.Client) bool { return cl == f.inlineCore || cl == f.inlineQueued }

// readTo is the highest KL_MSGS sequence the node has read (floorSource).
func (f *forwarder) readTo() uint64 { return f.node.QueuedPosition() }

// injecting is the KL_MSGS sequence of the queued message being injected
// (0: none).
func (f *forwarder) injecting() uint64 { return f.injectSeq.Load() }
