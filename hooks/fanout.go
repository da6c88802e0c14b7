package hooks

import (
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/outbox"
)

// The placeholder shared subscription makes mochi call OnSelectSubscribers
// for every publish (it only does when a shared subscription matches).
const (
	placeholderClient = "\x00keyline-fanout"
	placeholderFilter = "$share/keyline.fanout/#"
)

// DropSignalProperty is the MQTT 5 CONNECT user property with which a client
// asks for the drop signal (value "1"): the first message after drops
// carries the user property connq.DropSignalProperty with their number.
const DropSignalProperty = "drop-signal"

// FanoutStats are the fan-out hook's counters.
type FanoutStats struct {
	Deliveries atomic.Uint64 // QoS 0 frames queued for a connection
	Tracked    atomic.Uint64 // QoS 1/2 messages queued in a session's outbox
	Encodes    atomic.Uint64 // frames encoded (one per publish and variant)
	TooLarge   atomic.Uint64 // deliveries skipped: above the client's maximum packet size
	FastPath   atomic.Uint64 // publishes routed from the cached routes, never seen by mochi's router
	// StoreRefused counts QoS 1/2 publishes refused because a persistent
	// session's record of the message could not be stored (a full disk).
	StoreRefused atomic.Uint64
}

// Fanout takes every delivery to a client session over from mochi. Each
// publish is encoded once per frame variant (protocol version, QoS, retain
// flag, subscription identifiers); QoS 0 frames are queued by reference on
// every matching connection's connq.Conn, QoS 1/2 frames in each session's
// outbox (outbox.Outbox), which owns their packet ids, the client's Receive
// Maximum, and the resend order, and writes them to the store for persistent
// sessions. A connection whose subscriptions overlap gets one copy.
// Retained messages sent on SUBSCRIBE take the same path (mochi leaves them
// to this hook). Only inline subscriptions and Key-Shared groups are
// delivered elsewhere.
type Fanout struct {
	mqtt.HookBase
	server *mqtt.Server
	// canRead reports whether a client may receive messages on a topic; nil allows all.
	canRead func(cl *mqtt.Client, topic string) bool
	// limits gives a client's queue limits once its id is known.
	limits          func(cl *mqtt.Client) connq.Limits
	sharedElsewhere bool // FanoutConfig.SharedElsewhere
	// refs is FanoutConfig.Refs.
	refs        func(pk packets.Packet) uint64
	Stats       FanoutStats
	OutboxStats outbox.Stats

	sessions      *sessionRegistry
	routes        *topicCache[*routes]
	routesVersion atomic.Uint64 // bumped whenever mochi's topic index may have changed
	// subscribing holds, per client, what a SUBSCRIBE being handled needs
	// for its retained messages (fanout_retained.go).
	subscribing sync.Map // *mqtt.Client -> *retainedWork
}

// FanoutConfig configures a fan-out hook.
type FanoutConfig struct {
	// CanRead (nil: allow all) applies the broker's ACL to each delivery,
	// as mochi does.
	CanRead func(cl *mqtt.Client, topic string) bool
	// Limits (nil: keep the listener's) sets each connection's queue limits
	// when its session starts.
	Limits func(cl *mqtt.Client) connq.Limits
	// Store (nil: none) keeps persistent sessions' outboxes.
	Store outbox.Store
	// MaxSessionBytes and MaxTotalBytes bound the QoS 1/2 messages held for
	// sessions in bytes: per session and for all of them (0: no bound); past
	// either a new message is dropped for that session, counted and
	// signalled, as past max-inflight.
	MaxSessionBytes, MaxTotalBytes int64
	// Spill (nil: all in memory) keeps each outbox's frames in memory up to
	// its threshold; past it a persistent session's go cold (its Store
	// holds them) and the others' to the spill's files, until their client
	// reads them.
	Spill *outbox.Spill
	// SharedElsewhere says another hook delivers $share subscriptions
	// (Key-Shared), so they do not keep a publish on mochi's path.
	SharedElsewhere bool
	// Refs, when set, returns the backend's reference of a QoS 1/2 publish
	// (in cluster mode its JetStream sequence); every outbox copy keeps it,
	// and the outbox's Store sees it.
	Refs func(pk packets.Packet) uint64
}

// NewFanout returns a fan-out hook for server.
func NewFanout(server *mqtt.Server, cfg FanoutConfig) *Fanout {
	h := &Fanout{server: server, canRead: cfg.CanRead, limits: cfg.Limits,
		sharedElsewhere: cfg.SharedElsewhere, refs: cfg.Refs,
		routes: newTopicCache[*routes](maxCachedRoutes, maxCachedRouteBytes)}
	info := server.Info
	h.OutboxStats.InfoInflight, h.OutboxStats.InfoDropped = &info.Inflight, &info.InflightDropped
	h.sessions = newSessionRegistry(&outbox.Config{
		Max:           int(server.Options.Capabilities.MaximumInflight),
		MaxBytes:      cfg.MaxSessionBytes,
		MaxTotalBytes: cfg.MaxTotalBytes,
		Stats:         &h.OutboxStats,
		Store:         cfg.Store,
		Spill:         cfg.Spill,
	})
	return h
}

// Spill returns the outboxes' spill, nil when there is none.
func (h *Fanout) Spill() *outbox.Spill { return h.sessions.cfg.Spill }

// ID returns the hook's id.
func (h *Fanout) ID() string { return "keyline-fanout" }

// Provides reports which hook methods Fanout implements.
func (h *Fanout) Provides(b byte) bool { return fanoutEvents.has(b) }

var fanoutEvents = eventSet(
	mqtt.OnSelectSubscribers,
	mqtt.OnConnect,
	mqtt.OnSubscribe,
	mqtt.OnSessionEstablish,
	mqtt.OnPublish,
	mqtt.OnSubscribed,
	mqtt.OnUnsubscribed,
	mqtt.OnSessionEstablished,
	mqtt.OnStarted,
	mqtt.OnClientExpired,
	mqtt.OnPacketProcessed,
	mqtt.OnDisconnect,
)

// Init registers the placeholder shared subscription.
func (h *Fanout) Init(any) error {
	h.server.Topics.Subscribe(placeholderClient, packets.Subscription{Filter: placeholderFilter})
	return nil
}

// queueOf returns cl's connection queue, or nil.
func queueOf(cl *mqtt.Client) *connq.Conn {
	q, _ := cl.Net.Conn.(*connq.Conn)
	return q
}

// OnConnect tells the connection's writer about the client (protocol level,
// Maximum Packet Size, Topic Alias Maximum, drop signal). The writer assigns
// outbound topic aliases, so mochi is told the client takes none.
func (h *Fanout) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	q := queueOf(cl)
	if q == nil {
		return nil
	}
	props := &cl.Properties.Props
	s := connq.Session{Version: cl.Properties.ProtocolVersion, MaxPacketSize: props.MaximumPacketSize}
	if s.Version == 5 {
		s.TopicAliasMax = props.TopicAliasMaximum
		s.TopicAliasBytes = h.server.Options.Capabilities.TopicAliasBytes // the inbound table's bound, for this one too
		for _, u := range pk.Properties.User {
			s.DropSignal = s.DropSignal || (u.Key == DropSignalProperty && u.Val == "1")
		}
	}
	props.TopicAliasMaximum = 0
	q.SetSession(s)
	return nil
}

// OnSessionEstablish applies the queue limits that match the client's id.
func (h *Fanout) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if q := queueOf(cl); q != nil && h.limits != nil {
		q.SetLimits(h.limits(cl))
	}
}

// EncodePacket (a PacketEncoder step) attaches the session to its new
// connection when a successful CONNACK (reason code 0, in both protocol
// versions) is about to be written: mochi has decided by now whether
// the session is resumed (its subscriptions were re-indexed for the new
// connection just before), and OnSessionEstablished only runs after the
// client has its CONNACK, which it may answer at once. What the session
// sends from here on (first, what was in flight, in its original order)
// waits in the connection's queue behind the CONNACK (connq.AwaitConnack).
// Other acks it marks for the short encoding (shortAck); PacketEncoder
// runs it after every other step that may change an ack.
func (h *Fanout) EncodePacket(cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type != packets.Connack {
		shortAck(pk)
		return
	}
	q := queueOf(cl)
	if pk.ReasonCode != packets.CodeSuccess.Code || cl.Closed() || q == nil {
		// A refusal: MQTT 5's codes are 0x80 and above, MQTT 3.1.1's 0x01
		// to 0x05; a 3.1.1 CONNECT that breaks the protocol is stopped
		// (hooks.Protocol) and its CONNACK never sent. A refused
		// connection never reaches OnDisconnect, so nothing may be attached
		// to it: the session it names stays whoever's it is.
		return
	}
	var s *fanSession
	stale := pk.SessionPresent // a resumed session's subscriptions were re-indexed
	if pk.SessionPresent {
		s = h.sessions.ensure(cl)
	} else {
		// A new session: whatever was queued for the id is gone, and cached
		// routes may hold the session replaced.
		s, stale = h.sessions.replace(cl)
	}
	window := 0 // MQTT 3.1.1 has no Receive Maximum: the outbox's bound
	if cl.Properties.ProtocolVersion == 5 {
		window = int(cl.Properties.Props.ReceiveMaximum) // mochi caps it at max-inflight; 0: not sent
	}
	s.attach(&sessConn{q: q, version: cl.Properties.ProtocolVersion, maxPacket: maxPacketSize(cl), inflight: cl.State.Inflight},
		window, persistent(cl))
	if stale {
		h.invalidate()
	}
}

// ReadPacket (a PacketReader step) hands the client's PUBACK, PUBREC and
// PUBCOMP to its session's outbox. One the outbox owns reaches mochi as a
// PUBACK for packet id 0, which mochi ignores (it would answer a PUBREC it
// does not know with a PUBREL 0x92).
func (h *Fanout) ReadPacket(cl *mqtt.Client, pk *packets.Packet) {
	switch pk.FixedHeader.Type {
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
	default:
		return
	}
	s := h.sessions.get(cl.ID)
	if s == nil {
		return
	}
	if o := s.outbox(); o != nil && o.Ack(pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode) {
		// mochi keeps one in-flight map for both directions: a PUBACK with
		// this id could complete a QoS 2 flow the client started.
		pk.FixedHeader.Type, pk.PacketID = packets.Puback, 0
	}
}

// AllocPacketID picks a packet id for a delivery to cl that mochi's
// in-flight map tracks (Key-Shared): set records it there while the
// session's outbox cannot choose the same id. It reports false when no id
// is free now: try again later.
func (h *Fanout) AllocPacketID(cl *mqtt.Client, set func(id uint16)) (uint16, bool) {
	if s := h.sessions.get(cl.ID); s != nil {
		id := s.need(h.sessions.cfg).AllocExternal(set)
		return id, id != 0
	}
	id, err := cl.NextPacketID()
	if err != nil {
		return 0, false
	}
	set(uint16(id))
	return uint16(id), true
}

// OnDisconnect detaches the connection from its session, and discards a
// session that ends with its connection.
func (h *Fanout) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	s := h.sessions.get(cl.ID)
	if s == nil {
		return
	}
	if q := queueOf(cl); q != nil {
		s.detach(q)
	}
	if expire && cl.StopCause() != packets.ErrSessionTakenOver {
		h.sessions.drop(cl.ID, s)
		h.invalidate()
	}
}

// OnUnsubscribed invalidates the cached routes.
func (h *Fanout) OnUnsubscribed(*mqtt.Client, packets.Packet) { h.invalidate() }

// OnSessionEstablished invalidates the cached routes.
func (h *Fanout) OnSessionEstablished(*mqtt.Client, packets.Packet) { h.invalidate() }

// OnStarted drops sessions restored from the store that mochi did not
// restore (expired), and invalidates the cached routes.
func (h *Fanout) OnStarted() {
	for _, id := range h.sessions.ids() {
		if _, ok := h.server.Clients.Get(id); !ok {
			h.sessions.drop(id, nil)
		}
	}
	h.invalidate()
}

// OnClientExpired discards the session and invalidates the cached routes
// (mochi takes the client's subscriptions out of its topic index after the
// hooks: third_party/mochi/PATCHES.md).
func (h *Fanout) OnClientExpired(cl *mqtt.Client) {
	h.sessions.drop(cl.ID, nil)
	h.invalidate()
}

// Outbox describes the QoS 1/2 messages held for client id: how many, how
// many are in flight, and the first n of them.
func (h *Fanout) Outbox(id string, n int) (held, inflight int, msgs []outbox.Info) {
	s := h.sessions.get(id)
	if s == nil {
		return 0, 0, nil
	}
	o := s.outbox()
	if o == nil {
		return 0, 0, nil
	}
	held, inflight = o.Len()
	return held, inflight, o.Snapshot(n)
}

// Sessions returns how many sessions the fan-out holds, connected or not.
func (h *Fanout) Sessions() int { return len(h.sessions.ids()) }
