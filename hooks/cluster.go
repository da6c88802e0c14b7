package hooks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/sessionstore"
)

// SessionOutboxes is what the cluster hook needs of the fan-out's session
// outboxes (Fanout implements it).
type SessionOutboxes interface {
	// RequeueSession gives client id the messages its session held, in
	// order, encoded for protocol version; it returns how many it took.
	RequeueSession(id string, version byte, msgs []outbox.Queued) int
	// PrependSession puts msgs, in order, ahead of what client id's session
	// got since RequeueSession; msgs are every message for it with a
	// reference up to upTo, and one it got or gets live is not held twice.
	// It returns how many it took.
	PrependSession(id string, msgs []outbox.Queued, upTo uint64) int
	// RoutesChanged tells the fan-out that mochi's topic index changed.
	RoutesChanged()
	// DropSession discards what the fan-out holds for client id.
	DropSession(id string)
}

// Ids of the inline clients that inject messages from other nodes. Clients
// cannot take them: MQTT strings never hold U+0000.
const (
	clusterCoreClient   = "\x00keyline-cluster-core"
	clusterQueuedClient = "\x00keyline-cluster-queued"
	clusterSysClient    = "\x00keyline-cluster-sys"
	// clusterWillClient publishes the wills of clients of nodes that are
	// gone (cluster_wills.go); its publishes go to every node.
	clusterWillClient = "\x00keyline-cluster-will"
)

// ClusterStats are the cluster hook's counters.
type ClusterStats struct {
	Forwarded     atomic.Uint64 // publishes sent to other nodes
	Delivered     atomic.Uint64 // messages from other nodes delivered locally
	Refused       atomic.Uint64 // CONNECTs refused while NATS was unavailable
	ForwardErrors atomic.Uint64 // QoS 1/2 publishes the cluster could not store (publisher told)
	Expired       atomic.Uint64 // messages from other nodes that expired on the way
	Restored      atomic.Uint64 // queued messages restored into sessions taken over from other nodes
	RecordErrors  atomic.Uint64 // session record writes that failed
	Injected      atomic.Uint64 // packets injected into mochi (other nodes' messages, $SYS); mochi counts them as received
	Wills         atomic.Uint64 // wills of clients of nodes that are gone, published here
}

// Cluster is the mochi glue of cluster mode: it forwards local publishes
// and wills to the other nodes, delivers theirs locally,
// keeps the node's interest equal to its local subscriptions, and keeps
// session records (ownership, subscriptions, progress) in the cluster.
//
// It must be added after the Key-Shared hook and before the fan-out hook:
// the fan-out hook may answer OnPublish with CodeSuccessIgnore, which ends
// the hook chain, and forwarding must not depend on mochi's own routing.
type Cluster struct {
	mqtt.HookBase
	server *mqtt.Server
	node   *cluster.Node
	// records is where session records live (the node's bucket).
	records sessionstore.Store
	Stats   ClusterStats
	// Outboxes is the fan-out: a session taken over from another node gets
	// its queued messages there, and one another node took leaves it.
	Outboxes SessionOutboxes
	// Moved, when set, is told the id of a client whose session another
	// node took over, once this node has dropped its copy: Key-Shared ends
	// the client's memberships here (the new node rejoins them from the
	// record), rather than holding them through an eviction grace.
	Moved func(clientID string)

	inlineCore, inlineQueued, inlineSys, inlineWill *mqtt.Client
	// run tells this run of the node from an earlier one under the same id
	// (the wills in records carry it).
	run string

	// injectSeq is the KL_MSGS sequence of the queued message being injected
	// (one goroutine injects queued messages).
	injectSeq atomic.Uint64
	// pubSeq: publishing client id -> KL_MSGS sequence of the publish it is
	// in the middle of (stored, not yet delivered locally).
	pubSeq sync.Map
	// storing: *storeTicket -> a sequence every client store in flight
	// will be at or above (floorLocked keeps floors below it).
	storing sync.Map
	// publishers: *mqtt.Client -> its *cluster.Publisher.
	publishers sync.Map

	table *sessionTable // the sessions this node holds
	// refused holds the connections whose session ownership could not be
	// settled, until their CONNACK (a refusal) is out.
	refused sync.Map // *mqtt.Client -> struct{}

	nodes     nodeTable    // other nodes' figures
	sweep     *orphanSweep // made on the first sweep
	wills     *willWatch   // made by SetNode
	sweepOnce sync.Once
	stop      chan struct{}
	// stopping is cancelled by Stopping, as the broker starts to stop: a
	// CONNECT taking a session over gives up at once rather than keep the
	// listener's close waiting for its release requests.
	stopping    context.Context
	endStopping context.CancelFunc
	started     chan struct{} // closed by OnStarted: the hooks are in place
	wg          sync.WaitGroup
}

// NewCluster returns the cluster hook for server. Bind it to a node with
// SetNode before the server serves.
func NewCluster(server *mqtt.Server) *Cluster {
	h := &Cluster{server: server, table: newSessionTable(), stop: make(chan struct{}), started: make(chan struct{}), run: newRun()}
	h.stopping, h.endStopping = context.WithCancel(context.Background())
	for _, c := range []struct {
		cl **mqtt.Client
		id string
	}{{&h.inlineCore, clusterCoreClient}, {&h.inlineQueued, clusterQueuedClient}, {&h.inlineSys, clusterSysClient}, {&h.inlineWill, clusterWillClient}} {
		*c.cl = server.NewClient(nil, mqtt.LocalListener, c.id, true)
		(*c.cl).Properties.ProtocolVersion = 5
	}
	return h
}

// Handler returns what the cluster node calls back.
func (h *Cluster) Handler() cluster.Handler {
	return cluster.Handler{Message: h.deliver, Release: h.Release, NodeStats: h.nodeStats}
}

// SetNode binds the hook to its node and starts the session flusher.
func (h *Cluster) SetNode(n *cluster.Node) {
	h.node, h.records = n, n.SessionStore()
	h.wills = &willWatch{h: h, pending: map[string]pendingWill{}, gone: map[string]bool{}}
	for _, loop := range []func(){h.flushLoop, h.sysLoop, h.sweepLoop, h.willLoop} {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			loop()
		}()
	}
}

// Node returns the cluster node.
func (h *Cluster) Node() *cluster.Node { return h.node }

// ID returns the hook's id.
func (h *Cluster) ID() string { return "keyline-cluster" }

// Provides reports which hook methods Cluster implements.
func (h *Cluster) Provides(b byte) bool { return clusterEvents.has(b) }

var clusterEvents = eventSet(
	mqtt.OnConnect, mqtt.OnSessionEstablish, mqtt.OnDisconnect,
	mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.OnSelectSubscribers,
	mqtt.OnPublish, mqtt.OnPublished, mqtt.OnWillSent,
	mqtt.OnClientExpired, mqtt.OnPacketSent, mqtt.OnStarted,
)

// Stopping tells the hook the server is about to close: session takeovers
// still running (OnSessionEstablish) end, refused, and new ones are refused.
func (h *Cluster) Stopping() { h.endStopping() }

// Stop ends the flusher after a last flush of every session.
func (h *Cluster) Stop() error {
	select {
	case <-h.stop:
		return nil
	default:
	}
	close(h.stop)
	h.wg.Wait()
	return nil
}

// FromCluster reports whether cl is one of the clients that inject what
// other nodes send.
func (h *Cluster) FromCluster(cl *mqtt.Client) bool {
	return cl == h.inlineCore || cl == h.inlineQueued || cl == h.inlineSys
}

// Ready reports whether the node may take new connections.
func (h *Cluster) Ready() bool { return h.node != nil && h.node.Ready() }

// OnConnect refuses new connections while NATS or JetStream is unavailable,
// rather than serving a split namespace: CONNACK 0x88 (3.1.1: 0x03).
func (h *Cluster) OnConnect(cl *mqtt.Client, _ packets.Packet) error {
	if h.Ready() {
		return nil
	}
	h.Stats.Refused.Add(1)
	_ = h.server.SendConnack(cl, packets.ErrServerUnavailable, false, nil)
	return packets.ErrServerUnavailable
}

// --- publishing to other nodes ---

// OnPublish forwards a publish from a local client to the other nodes. QoS
// 1/2 publishes are stored in the cluster before mochi acknowledges them; if
// that fails the publisher is told (MQTT 5: PUBACK/PUBREC 0x80; 3.1.1: the
// connection is closed without an acknowledgement). A client's store is
// asynchronous: the publish is deferred (mochi goes on reading the client's
// packets, PATCHES.md item 21) and resumed once stored, in the client's
// order, so that its acknowledgement, the hooks after this one (the
// fan-out's deliveries) and mochi's routing all follow the store.
func (h *Cluster) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if (cl.Net.Inline && !forwardedInline(cl.ID)) || h.node == nil {
		return pk, nil // the broker's own ($SYS) or from another node; dead letters and bridged messages go to every node
	}
	body, err := encodeEnvelope(pk)
	if err != nil {
		h.Log.Warn("cluster: not forwarding a publish", "topic", pk.TopicName, "error", err)
		return pk, nil
	}
	if pk.FixedHeader.Qos > 0 && !cl.Net.Inline {
		return pk, h.storeDeferred(cl, pk, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cluster.DefaultPublishTimeout+time.Second)
	defer cancel()
	seq, err := h.node.Publish(ctx, pk.TopicName, pk.FixedHeader.Qos, body)
	if err != nil {
		if pk.FixedHeader.Qos == 0 {
			h.Log.Debug("cluster: QoS 0 publish not forwarded", "topic", pk.TopicName, "error", err)
			return pk, nil
		}
		return pk, h.refuseStore(cl, pk, err)
	}
	h.Stats.Forwarded.Add(1)
	if seq > 0 {
		h.pubSeq.Store(cl.ID, seq) // OnQosPublish ties local deliveries to it
	}
	return pk, nil
}

// storeTicket marks a client's store in flight (Cluster.storing).
type storeTicket struct{}

// storeDeferred starts a QoS 1/2 publish's store on the client's publisher
// and defers the publish until it answers.
func (h *Cluster) storeDeferred(cl *mqtt.Client, pk packets.Packet, body []byte) error {
	v, ok := h.publishers.Load(cl)
	if !ok {
		v, _ = h.publishers.LoadOrStore(cl, h.node.NewPublisher())
	}
	d := mqtt.DeferPublish()
	t := new(storeTicket)
	// The message will be above every sequence the node has read so far:
	// no session's floor passes it until its local deliveries are recorded.
	h.storing.Store(t, h.node.QueuedPosition()+1)
	v.(*cluster.Publisher).Store(pk.TopicName, body, func(seq uint64, err error) {
		if err != nil {
			h.storing.Delete(t)
			d.Resume(h.refuseStore(cl, pk, err))
			return
		}
		h.Stats.Forwarded.Add(1)
		h.pubSeq.Store(cl.ID, seq) // OnQosPublish ties local deliveries to it
		h.storing.Delete(t)
		// Resume runs the rest of the publish here, in the client's order,
		// and OnPublished clears pubSeq; or, when the store was
		// acknowledged before mochi took d in (a fast store), the rest runs
		// on the client's reader once it does, and pubSeq must stay for it
		// (cleared there, or by OnDisconnect): cleared here, that run's
		// local deliveries would hold no session's floor.
		if d.Resume(nil) {
			h.pubSeq.CompareAndDelete(cl.ID, seq) // a publish that ended before OnPublished
		}
	})
	return d
}

// refuseStore answers a QoS 1/2 publish that could not be stored.
func (h *Cluster) refuseStore(cl *mqtt.Client, pk packets.Packet, err error) error {
	h.Stats.ForwardErrors.Add(1)
	h.Log.Warn("cluster: QoS 1/2 publish not stored; refusing it", "topic", pk.TopicName, "client", cl.ID, "error", err)
	if cl.Properties.ProtocolVersion == 5 {
		return packets.ErrUnspecifiedError
	}
	cl.Stop(fmt.Errorf("cluster: message not stored: %w", err))
	return packets.ErrRejectPacket
}

// OnPublished ends a publish: its local deliveries are all recorded.
func (h *Cluster) OnPublished(cl *mqtt.Client, pk packets.Packet) {
	// A QoS 0 publish has no sequence, and may end while one of the
	// client's deferred QoS 1/2 publishes is being delivered.
	if pk.FixedHeader.Qos > 0 && (!cl.Net.Inline || forwardedInline(cl.ID)) {
		h.pubSeq.Delete(cl.ID)
	}
}

// OnWillSent forwards a will to the other nodes (mochi has delivered it
// locally; a retained will was stored by the Retained hook).
func (h *Cluster) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	if h.node == nil || cl.Net.Inline {
		return
	}
	h.willSent(cl)
	body, err := encodeEnvelope(pk)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), cluster.DefaultPublishTimeout+time.Second)
		_, err = h.node.Publish(ctx, pk.TopicName, pk.FixedHeader.Qos, body)
		cancel()
	}
	if err != nil {
		h.Log.Warn("cluster: will not forwarded", "client", cl.ID, "topic", pk.TopicName, "error", err)
		return
	}
	h.Stats.Forwarded.Add(1)
}

// --- delivering what other nodes send ---

// deliver injects a message from another node into mochi, which delivers it
// to the local subscribers (the fan-out hook takes QoS 0 deliveries). It
// does not come back to OnPublish's forwarding, and Key-Shared groups do
// not take it (they are per node).
func (h *Cluster) deliver(in cluster.Incoming) {
	pk, err := decodeEnvelope(in.Data)
	if err != nil {
		h.Log.Warn("cluster: dropping a malformed message", "error", err)
		return
	}
	if !remainingExpiry(&pk, time.Now()) {
		h.Stats.Expired.Add(1)
		return
	}
	// Retained state comes from the retained stream, in its order; a live
	// copy must not overwrite it (it may be older than what the stream holds).
	// Its retain flag stays for delivery: retain-as-published subscribers
	// see it set, as they do on one node [MQTT-3.3.1-12].
	pk.Mods.RetainNotStored = true
	cl := h.inlineCore
	if in.Queued {
		cl = h.inlineQueued
		h.injectSeq.Store(in.Seq)
		defer h.injectSeq.Store(0)
	}
	if err := h.server.InjectPacket(cl, pk); err != nil {
		h.Log.Warn("cluster: delivering a message from another node", "topic", pk.TopicName, "error", err)
		return
	}
	h.Stats.Injected.Add(1)
	h.Stats.Delivered.Add(1)
}

// OnSelectSubscribers keeps a queued message from a session that already
// got it through a replay (a session taken over from another node), or
// whose matching subscriptions are younger than the message.
func (h *Cluster) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if pk.Origin != clusterQueuedClient {
		return subs
	}
	seq := h.injectSeq.Load()
	h.table.locked(func(get func(string) *clusterSession) {
		for id := range subs.Subscriptions {
			if s := get(id); s != nil && !s.takesQueued(pk.TopicName, seq) {
				delete(subs.Subscriptions, id)
			}
		}
	})
	return subs
}

// --- subscriptions: the node's interest ---

// OnSubscribed registers the granted subscriptions' filters with the node
// (waiting until other nodes' messages will reach it) and stores them in a
// persistent session's record before the SUBACK goes out.
func (h *Cluster) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if h.node == nil || cl.Net.Inline {
		return
	}
	s := h.session(cl)
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var added []packets.Subscription
	var fresh []string
	s.mu.Lock()
	for i, f := range pk.Filters {
		if i >= len(reasonCodes) || reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		sub := f
		sub.Qos = reasonCodes[i]
		added = append(added, sub) // new, or the same filter with new options
		if mqtt.IsSharedFilter(f.Filter) {
			continue // in the record only: a Key-Shared group has a log of its own
		}
		if _, known := s.since[f.Filter]; !known {
			s.setSinceLocked(f.Filter, sincePending) // takes no queued message yet
			fresh = append(fresh, f.Filter)
		}
	}
	s.mu.Unlock()
	var since uint64
	if len(fresh) > 0 {
		h.addInterest(ctx, s, fresh...)
		// Read once the node's consumer takes the filters: every later
		// message reaches this node.
		var err error
		if since, err = h.node.LastSequence(ctx); err != nil {
			h.Log.Warn("cluster: subscription start unknown; it may get messages published just before it", "client", cl.ID, "error", err)
		}
		s.mu.Lock()
		for _, f := range fresh {
			s.setSinceLocked(f, since)
		}
		s.mu.Unlock()
	}
	if len(added) > 0 && s.persistent.Load() {
		h.saveSubscriptions(ctx, s, added, since, nil)
	}
}

// OnUnsubscribed drops the filters from the node's interest and the record.
func (h *Cluster) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	if h.node == nil || cl.Net.Inline {
		return
	}
	s := h.session(cl)
	if s == nil {
		return
	}
	var removed []string
	for _, f := range pk.Filters {
		if mqtt.IsSharedFilter(f.Filter) {
			s.mu.Lock()
			_, ok := s.subs[f.Filter]
			s.mu.Unlock()
			if ok {
				removed = append(removed, f.Filter)
			}
		} else if h.removeInterest(s, f.Filter) {
			removed = append(removed, f.Filter)
		}
	}
	if len(removed) > 0 && s.persistent.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.saveSubscriptions(ctx, s, nil, 0, removed)
	}
}

// addInterest registers the session's new filters with the node and waits
// until other nodes' messages for them reach it.
func (h *Cluster) addInterest(ctx context.Context, s *clusterSession, filters ...string) {
	var fresh []string
	s.mu.Lock()
	for _, f := range filters {
		if !s.filters[f] {
			s.filters[f] = true
			fresh = append(fresh, f)
		}
	}
	s.mu.Unlock()
	if len(fresh) == 0 {
		return
	}
	if err := h.node.AddInterests(ctx, fresh...); err != nil && !errors.Is(err, cluster.ErrInvalidTopic) {
		h.Log.Warn("cluster: subscription not yet known to the other nodes", "filters", fresh, "error", err)
	}
}

func (h *Cluster) removeInterest(s *clusterSession, filter string) bool {
	s.mu.Lock()
	had := s.filters[filter]
	delete(s.filters, filter)
	delete(s.since, filter)
	s.mu.Unlock()
	if had {
		h.node.RemoveInterest(filter)
	}
	return had
}
