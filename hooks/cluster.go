package hooks

// The cluster hook (Cluster) is the mochi glue of cluster mode. It holds no
// state of its own: each part owns one kind of state, behind its own lock
// or none, and reaches the cluster node only through a small interface of
// the node's methods it calls (clusterNode adapts *cluster.Node), so that
// each part is tested with fakes of it, without NATS:
//
//	part               owns                                     node interface  file
//	forwarder          publishes in flight to/from other nodes  forwardNode     cluster_forward.go
//	                   (their KL_MSGS sequences), the injecting
//	                   clients
//	sessionTable       which copy of each session is installed  none            cluster_table.go
//	sessionOwner       the ownership protocol: acquire, restore, sessionNode     cluster_sessions.go,
//	                   release, forget; refused connections                     cluster_restore.go
//	recordWriter       session records: floor, acks, state      (floorSource)   cluster_resolved.go
//	interest           the node's interest per session          interestNode    cluster_interest.go
//	clusterKeyFilters  members' key filters (KeyFilterStore)    none            cluster_keyfilters.go
//	clusterOutboxes    the outboxes' KL_MSGS references         none            cluster_resolved.go
//	sysFigures         other nodes' figures, $SYS totals        sysNode         cluster_sys.go
//	orphanSweep        sessions whose owner is gone             (alive func)    cluster_sweep.go
//	willWatch          wills of clients of nodes that are gone  willNode        cluster_wills.go
//
// Cluster builds the parts (NewCluster), binds them to the node (SetNode),
// runs their loops, and turns each mochi event into calls on them.

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/outbox"
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
// session records (ownership, subscriptions, progress) in the cluster. The
// work is its parts' (see the top of this file). Its KeyFilterStore is
// clusterKeyFilters'.
//
// It must be added after the Key-Shared hook and before the fan-out hook:
// the fan-out hook may answer OnPublish with CodeSuccessIgnore, which ends
// the hook chain, and forwarding must not depend on mochi's own routing.
type Cluster struct {
	mqtt.HookBase
	clusterKeyFilters
	server *mqtt.Server
	node   *cluster.Node
	Stats  ClusterStats
	// Outboxes is the fan-out: a session taken over from another node gets
	// its queued messages there, and one another node took leaves it.
	Outboxes SessionOutboxes
	// Moved, when set, is told the id of a client whose session another
	// node took over, once this node has dropped its copy: Key-Shared ends
	// the client's memberships here (the new node rejoins them from the
	// record), rather than holding them through an eviction grace.
	Moved func(clientID string)

	fwd      *forwarder
	table    *sessionTable // the sessions this node holds
	owner    *sessionOwner
	writer   *recordWriter
	interest *interest
	sys      *sysFigures
	sweep    *orphanSweep // made by SetNode
	wills    *willWatch   // made by SetNode

	stop chan struct{}
	// endStopping is called by Stopping, as the broker starts to stop: a
	// CONNECT taking a session over gives up at once rather than keep the
	// listener's close waiting for its release requests.
	endStopping context.CancelFunc
	started     chan struct{} // closed by OnStarted: the hooks are in place
	wg          sync.WaitGroup
}

// NewCluster returns the cluster hook for server. Bind it to a node with
// SetNode before the server serves.
func NewCluster(server *mqtt.Server) *Cluster {
	h := &Cluster{server: server, table: newSessionTable(), stop: make(chan struct{}), started: make(chan struct{})}
	inline := func(id string) *mqtt.Client {
		cl := server.NewClient(nil, mqtt.LocalListener, id, true)
		cl.Properties.ProtocolVersion = 5
		return cl
	}
	log := func() *slog.Logger { return h.Log }
	h.clusterKeyFilters = clusterKeyFilters{h.table}
	h.fwd = &forwarder{inject: server, log: log, stats: &h.Stats,
		inlineCore: inline(clusterCoreClient), inlineQueued: inline(clusterQueuedClient)}
	h.writer = &recordWriter{table: h.table, floors: h.fwd, stats: &h.Stats, log: log}
	h.interest = &interest{table: h.table, writer: h.writer, log: log}
	stopping, end := context.WithCancel(context.Background())
	h.endStopping = end
	h.owner = &sessionOwner{server: server, table: h.table, interest: h.interest, writer: h.writer, run: newRun(),
		outboxes: func() SessionOutboxes { return h.Outboxes },
		moved: func(id string) {
			if h.Moved != nil {
				h.Moved(id)
			}
		},
		stopping: stopping, stats: &h.Stats, log: log}
	h.writer.stale = h.owner.dropCopy
	h.sys = &sysFigures{mochi: nodeFigureSource{info: server.Info, clients: server.Clients}, inject: server,
		inline: inline(clusterSysClient), stats: &h.Stats, log: log}
	h.wills = &willWatch{inject: server, inline: inline(clusterWillClient), run: h.owner.run, stats: &h.Stats, log: log,
		heard: h.sys.nodes.lastHeard, maxExpiry: server.Options.Capabilities.MaximumSessionExpiryInterval,
		pending: map[string]pendingWill{}, gone: map[string]bool{}}
	return h
}

// Handler returns what the cluster node calls back.
func (h *Cluster) Handler() cluster.Handler {
	return cluster.Handler{Message: h.fwd.deliver, Release: h.Release,
		NodeStats: func(data []byte) { h.sys.nodes.heard(data, time.Now()) }}
}

// SetNode binds the hook to its node and starts its loops: the session
// flusher, the $SYS figures, the orphan sweep and the will watch.
func (h *Cluster) SetNode(n *cluster.Node) {
	h.node = n
	node, records := clusterNode{n}, n.SessionStore()
	h.fwd.node, h.interest.node, h.sys.node = node, node, node
	h.owner.node, h.owner.records, h.writer.records = node, records, records
	h.wills.node, h.wills.records = node, records
	h.sweep = &orphanSweep{records: records, self: n.NodeID(), alive: n.Alive, maxExpiry: h.wills.maxExpiry,
		orphans: map[string]time.Time{}, wills: h.wills.note}
	log := func() *slog.Logger { return h.Log }
	for _, loop := range []func(){
		func() { h.writer.loop(h.stop) },
		func() { h.sys.loop(h.stop) },
		func() { h.sweep.loop(h.stop, log) },
		func() { h.wills.loop(h.started, h.stop) },
	} {
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

// OnStarted lets the will watch begin: mochi serves, every hook is added.
func (h *Cluster) OnStarted() {
	select {
	case <-h.started:
	default:
		close(h.started)
	}
}

// Stopping tells the hook the server is about to close: session takeovers
// still running (OnSessionEstablish) end, refused, and new ones are refused.
func (h *Cluster) Stopping() { h.endStopping() }

// Stop ends the loops after a last flush of every session.
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
func (h *Cluster) FromCluster(cl *mqtt.Client) bool { return h.fwd.injects(cl) || cl == h.sys.inline }

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

// OnPublish forwards a publish from a local client to the other nodes. QoS
// 1/2 publishes are stored in the cluster before mochi acknowledges them; if
// that fails the publisher is told (MQTT 5: PUBACK/PUBREC 0x80; 3.1.1: the
// connection is closed without an acknowledgement). A client's store is
// asynchronous: the publish is deferred (mochi goes on reading the client's
// packets, PATCHES.md item 21) and resumed once stored, in the client's
// order, so that its acknowledgement, the hooks after this one (the
// fan-out's deliveries) and mochi's routing all follow the store.
func (h *Cluster) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.node == nil {
		return pk, nil
	}
	return h.fwd.publish(cl, pk)
}

// OnPublished ends a publish: its local deliveries are all recorded.
func (h *Cluster) OnPublished(cl *mqtt.Client, pk packets.Packet) { h.fwd.published(cl, pk) }

// OnWillSent forwards a will to the other nodes (mochi has delivered it
// locally; a retained will was stored by the Retained hook) and drops it
// from the session's record.
func (h *Cluster) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	if h.node == nil || cl.Net.Inline {
		return
	}
	h.writer.willSent(cl)
	h.fwd.forwardWill(cl, pk)
}

// MessageRef is the fan-out's Refs in cluster mode: the KL_MSGS sequence of
// a QoS 1/2 publish, kept with every outbox copy of it so that the
// session's floor stays below it until it is acknowledged. A message from
// another node is the one being injected; a local publish was stored by
// OnPublish before it is delivered here. Retained messages and QoS 0 have
// none (0).
func (h *Cluster) MessageRef(pk packets.Packet) uint64 { return h.fwd.ref(pk) }

// OnSelectSubscribers keeps a queued message from a session that already
// got it through a replay (a session taken over from another node), or
// whose matching subscriptions are younger than the message.
func (h *Cluster) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if pk.Origin != clusterQueuedClient {
		return subs
	}
	seq := h.fwd.injecting()
	h.table.locked(func(get func(string) *clusterSession) {
		for id := range subs.Subscriptions {
			if s := get(id); s != nil && !s.takesQueued(pk.TopicName, seq) {
				delete(subs.Subscriptions, id)
			}
		}
	})
	return subs
}

// OnSubscribed registers the granted subscriptions' filters with the node
// (waiting until other nodes' messages will reach it) and stores them in a
// persistent session's record before the SUBACK goes out.
func (h *Cluster) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if h.node != nil && !cl.Net.Inline {
		h.interest.subscribed(cl, pk, reasonCodes)
	}
}

// OnUnsubscribed drops the filters from the node's interest and the record.
func (h *Cluster) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	if h.node != nil && !cl.Net.Inline {
		h.interest.unsubscribed(cl, pk)
	}
}

// OnSessionEstablish takes the session over from wherever it was (see the
// ownership protocol in cluster_sessions.go) before mochi looks for a local
// one. If the cluster cannot settle ownership the CONNECT is refused
// (EncodePacket turns the CONNACK into 0x88).
func (h *Cluster) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	if h.node != nil && !cl.Net.Inline {
		h.owner.establish(cl, pk)
	}
}

// Release drops this node's copy of a client's session: another node is
// taking it over from record revision upTo (sessionOwner.release).
func (h *Cluster) Release(clientID string, upTo uint64) { h.owner.release(clientID, upTo) }

// EncodePacket (a PacketEncoder step) turns the CONNACK of a connection
// whose session ownership could not be settled into a refusal.
func (h *Cluster) EncodePacket(cl *mqtt.Client, pk *packets.Packet) { h.owner.encodePacket(cl, pk) }

// OnPacketSent closes a refused connection once its CONNACK is out.
func (h *Cluster) OnPacketSent(cl *mqtt.Client, pk packets.Packet, _ []byte) {
	h.owner.packetSent(cl, pk)
}

// OnDisconnect writes a persistent session's state as it goes offline, or
// deletes the record of a session that ends with its connection.
func (h *Cluster) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if h.node == nil || cl.Net.Inline {
		return
	}
	h.fwd.disconnected(cl)
	h.owner.disconnect(cl, err, expire)
}

// OnClientExpired deletes an expired session's record.
func (h *Cluster) OnClientExpired(cl *mqtt.Client) {
	if h.node != nil {
		h.owner.expired(cl)
	}
}

// SweepOrphans deletes the records of sessions left by nodes that are gone
// (orphanSweep) and returns the client ids deleted.
func (h *Cluster) SweepOrphans(ctx context.Context, now time.Time) ([]string, error) {
	return h.sweep.run(ctx, now)
}

// ClusterFigures returns the figures of every node heard from recently,
// this one first.
func (h *Cluster) ClusterFigures() []nodeFigures { return h.sys.figures(time.Now()) }
