package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// KeyFilterProperty is the MQTT 5 SUBSCRIBE user property that carries a
// member's key filter (repeatable; glob patterns with * and ?).
const KeyFilterProperty = "key-filter"

// DLQPrefix is the topic prefix dead letters are published under:
// $dlq/<share name>/<original topic> (a group's full name holds its filter's
// wildcards, which a topic name may not; the dlq-group property names it).
const DLQPrefix = "$dlq/"

// KeySharedConfig configures the Key-Shared hook.
type KeySharedConfig struct {
	// KeyProperty names the MQTT 5 user property holding a message's routing
	// key; a message without it is keyed by its topic.
	KeyProperty string
	// GroupSettings returns the dispatcher and storage settings of a group
	// (global settings with the group's overrides applied).
	GroupSettings func(group string) (keyshared.Config, persistence.GroupConfig)
	// CanRead reports whether a client may receive a message on a topic; nil allows all.
	CanRead func(cl *mqtt.Client, topic string) bool
	// Sessions, when set, keeps the key filters of persistent sessions'
	// memberships, so that a session resumed after a restart keeps them.
	Sessions *persistence.SessionStore
}

// KeyShared dispatches `$share/<group>/<filter>` subscriptions Key-Shared: it
// is the mochi glue between MQTT clients and one keyshared.Dispatcher per
// group, over the durable group logs of a persistence.GroupStore. It
//   - appends each matching QoS >= 1 publish to the group logs before mochi
//     acknowledges it, and routes QoS 0 ones on the ring (keyshared.Router);
//   - takes mochi's own shared-subscription delivery away;
//   - turns SUBSCRIBE/UNSUBSCRIBE/DISCONNECT into member changes;
//   - delivers the dispatcher's messages as PUBLISH packets with packet ids
//     kept in mochi's inflight state, and reads members' PUBACK/PUBREC/PUBCOMP
//     as acks and nacks.
type KeyShared struct {
	mqtt.HookBase
	server *mqtt.Server
	store  persistence.GroupStore
	cfg    KeySharedConfig
	inline *mqtt.Client // publishes dead letters to $dlq/...

	mu struct {
		sync.RWMutex
		groups  map[string]*ksGroup               // by name
		index   *mqtt.TopicsIndex                 // group filters; "client id" = group name
		members map[string]map[string]*membership // client id -> group name -> membership
	}
	// matches caches topic -> matching groups; indexVersion invalidates it
	// (bumped under mu.Lock whenever the index changes).
	matches      sync.Map // string -> cachedMatch
	matchesSize  atomic.Int64
	indexVersion atomic.Uint64

	inflight struct {
		sync.Mutex
		byPacket map[packetKey]delivery // (client, packet id) -> delivery
		byOffset map[offsetKey]uint16   // (group, client, offset) -> packet id
	}

	// AppendErrors counts QoS >= 1 publishes a group log refused.
	AppendErrors atomic.Uint64
}

type cachedMatch struct {
	version uint64
	groups  []*ksGroup
}

// maxCachedTopics bounds the topic -> groups cache; past it the cache starts over.
const maxCachedTopics = 100_000

type ksGroup struct {
	name, share, filter string
	d                   *keyshared.Dispatcher
	r                   *keyshared.Router
}

type membership struct {
	qos        byte     // granted QoS
	keyFilters []string // none: every key
}

type packetKey struct {
	client string
	id     uint16
}

type offsetKey struct {
	group, client string
	offset        uint64
}

type delivery struct {
	group  *ksGroup
	offset uint64
}

// NewKeyShared returns the Key-Shared hook. Call Start once the server has
// loaded its stored state (after Serve) to resume the stored groups.
func NewKeyShared(server *mqtt.Server, store persistence.GroupStore, cfg KeySharedConfig) *KeyShared {
	h := &KeyShared{server: server, store: store, cfg: cfg}
	h.mu.groups = map[string]*ksGroup{}
	h.mu.index = mqtt.NewTopicsIndex()
	h.mu.members = map[string]map[string]*membership{}
	h.inflight.byPacket = map[packetKey]delivery{}
	h.inflight.byOffset = map[offsetKey]uint16{}
	h.inline = server.NewClient(nil, mqtt.LocalListener, "keyline-dlq", true)
	h.inline.Properties.ProtocolVersion = 5
	return h
}

// ID returns the hook's id.
func (h *KeyShared) ID() string { return "keyline-keyshared" }

// Provides reports which hook methods KeyShared implements.
func (h *KeyShared) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSubscribe, mqtt.OnSubscribed, mqtt.OnUnsubscribed,
		mqtt.OnSessionEstablished, mqtt.OnDisconnect,
		mqtt.OnPublish, mqtt.OnSelectSubscribers, mqtt.OnPacketRead,
	}, []byte{b})
}

// Init notifies dispatchers of new log entries and resumes every stored group,
// so publishes keep landing in groups whose members are away.
func (h *KeyShared) Init(any) error {
	h.store.OnAppend(func(group string, _ uint64) {
		h.mu.RLock()
		g := h.mu.groups[group]
		h.mu.RUnlock()
		if g != nil {
			g.d.Notify()
		}
	})
	infos, err := h.store.Groups()
	if err != nil {
		return fmt.Errorf("keyshared hook: list groups: %w", err)
	}
	for _, gi := range infos {
		if _, err := h.ensureGroup(gi.Name, gi.Share, gi.Filter); err != nil {
			return err
		}
	}
	return nil
}

// Stop closes every dispatcher, persisting its cursor.
func (h *KeyShared) Stop() error {
	h.mu.Lock()
	groups := h.mu.groups
	h.mu.groups = map[string]*ksGroup{}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, g := range groups {
		if err := g.d.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("group %s: %w", g.name, err))
		}
	}
	return errors.Join(errs...)
}

// groupOf returns the group of a well-formed shared subscription filter.
func groupOf(filter string) (share.Name, bool) {
	n, shared, err := share.ParseSubscription(filter)
	return n, shared && err == nil
}

// ensureGroup returns the running group, creating its log and dispatcher if needed.
func (h *KeyShared) ensureGroup(name, share, filter string) (*ksGroup, error) {
	h.mu.RLock()
	g := h.mu.groups[name]
	h.mu.RUnlock()
	if g != nil {
		return g, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if g := h.mu.groups[name]; g != nil {
		return g, nil
	}
	dcfg, gcfg := h.cfg.GroupSettings(name)
	if _, err := h.store.EnsureGroup(name, gcfg); err != nil {
		return nil, fmt.Errorf("keyshared hook: group %s: %w", name, err)
	}
	log, err := h.store.Log(name)
	if err != nil {
		return nil, fmt.Errorf("keyshared hook: group %s: %w", name, err)
	}
	g = &ksGroup{name: name, share: share, filter: filter}
	dcfg.Group = name
	dcfg.Logger = h.Log.With("group", name)
	g.d, err = keyshared.New(dcfg, &dlqLog{Log: log, h: h, group: name}, &groupOut{h: h, g: g})
	if err != nil {
		return nil, fmt.Errorf("keyshared hook: group %s: %w", name, err)
	}
	g.r = keyshared.NewRouter(&groupOut{h: h, g: g})
	h.mu.groups[name] = g
	h.mu.index.Subscribe(name, packets.Subscription{Filter: filter})
	h.indexVersion.Add(1)
	return g, nil
}

// DeleteGroup stops a group and deletes its log, cursor and dead letters. A
// group with members is refused: they would recreate it at once.
func (h *KeyShared) DeleteGroup(ctx context.Context, name string) error {
	h.mu.Lock()
	g := h.mu.groups[name]
	if g != nil {
		if n := h.memberCountLocked(name); n > 0 {
			h.mu.Unlock()
			return fmt.Errorf("%w: group %s has %d members; they must unsubscribe first", ErrGroupBusy, name, n)
		}
		delete(h.mu.groups, name)
		h.mu.index.Unsubscribe(g.filter, name)
		h.indexVersion.Add(1)
	}
	h.mu.Unlock()
	if g != nil {
		_ = g.d.Close(ctx)
	}
	return h.store.DeleteGroup(name)
}

// ErrGroupBusy is returned by DeleteGroup for a group that still has members.
var ErrGroupBusy = errors.New("keyshared hook: group has members")

func (h *KeyShared) memberCountLocked(group string) int {
	n := 0
	for _, gs := range h.mu.members {
		if _, ok := gs[group]; ok {
			n++
		}
	}
	return n
}

// SweepIdle deletes the groups that have had no members for ttl.
func (h *KeyShared) SweepIdle(ctx context.Context, now time.Time, ttl time.Duration) ([]string, error) {
	h.mu.RLock()
	var idle []string
	for name := range h.mu.groups {
		if h.memberCountLocked(name) == 0 {
			idle = append(idle, name)
		}
	}
	h.mu.RUnlock()
	if len(idle) == 0 {
		return nil, nil
	}
	swept, err := h.store.SweepIdle(now, ttl)
	for _, name := range swept {
		h.mu.Lock()
		g := h.mu.groups[name]
		if g != nil {
			delete(h.mu.groups, name)
			h.mu.index.Unsubscribe(g.filter, name)
			h.indexVersion.Add(1)
		}
		h.mu.Unlock()
		if g != nil {
			_ = g.d.Close(ctx)
		}
	}
	return swept, err
}

// GroupStatus is a group's stored figures and live dispatch figures.
type GroupStatus struct {
	Info    persistence.GroupInfo
	Stats   keyshared.Stats
	QoS0    keyshared.RouterStats
	Running bool
}

// Groups returns every stored group's status, sorted by name.
func (h *KeyShared) Groups() ([]GroupStatus, error) {
	infos, err := h.store.Groups()
	if err != nil {
		return nil, err
	}
	out := make([]GroupStatus, 0, len(infos))
	for _, gi := range infos {
		out = append(out, h.status(gi))
	}
	return out, nil
}

// Group returns one group's status.
func (h *KeyShared) Group(name string) (GroupStatus, error) {
	gi, err := h.store.Group(name)
	if err != nil {
		return GroupStatus{}, err
	}
	return h.status(gi), nil
}

func (h *KeyShared) status(gi persistence.GroupInfo) GroupStatus {
	h.mu.RLock()
	g := h.mu.groups[gi.Name]
	h.mu.RUnlock()
	st := GroupStatus{Info: gi}
	if g != nil {
		st.Running, st.Stats, st.QoS0 = true, g.d.Stats(), g.r.Stats()
	}
	return st
}

// Store returns the group store (for dead-letter tooling).
func (h *KeyShared) Store() persistence.GroupStore { return h.store }

// --- subscriptions and members ---

// keyFilters returns the key-filter user properties of a SUBSCRIBE.
func keyFilters(pk packets.Packet) []string {
	var out []string
	for _, p := range pk.Properties.User {
		if p.Key == KeyFilterProperty {
			out = append(out, p.Val)
		}
	}
	return out
}

// OnSubscribe invalidates malformed shared subscriptions (empty share name or
// filter, bad key filters) so that mochi answers them 0x8F Topic Filter invalid.
func (h *KeyShared) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	var filtersErr error
	for _, f := range keyFilters(pk) {
		if err := keyshared.ValidateFilter(f); err != nil {
			filtersErr = err
			break
		}
	}
	for i, f := range pk.Filters {
		_, shared, err := share.ParseSubscription(f.Filter)
		switch {
		case !shared:
			continue
		case err != nil:
			h.Log.Info("refusing shared subscription: want $share/<share name>/<topic filter>", "client", cl.ID, "filter", f.Filter, "error", err)
		case filtersErr != nil:
			h.Log.Info("refusing shared subscription: invalid key filter", "client", cl.ID, "filter", f.Filter, "error", filtersErr)
		default:
			continue
		}
		pk.Filters[i].Filter = "" // mochi answers an invalid filter with 0x8F
	}
	return pk
}

// OnSubscribed makes the client a member of each shared group it was granted.
func (h *KeyShared) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	filters := keyFilters(pk)
	for i, f := range pk.Filters {
		if i >= len(reasonCodes) || reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		n, ok := groupOf(f.Filter)
		if !ok {
			continue
		}
		h.join(cl, n, &membership{qos: reasonCodes[i], keyFilters: filters})
		h.saveKeyFilters(cl, f.Filter, filters)
	}
}

// saveKeyFilters records a persistent session's key filters for a shared
// subscription (queued before the storage hook's commit of the subscription
// itself, so the SUBACK covers both).
func (h *KeyShared) saveKeyFilters(cl *mqtt.Client, filter string, filters []string) {
	if h.cfg.Sessions == nil || !persistent(cl) {
		return
	}
	key := subscriptionKey(cl.ID, filter)
	if len(filters) == 0 {
		h.cfg.Sessions.Delete(persistence.KindKeyFilters, key)
		return
	}
	data, err := json.Marshal(filters)
	if err != nil {
		h.Log.Error("encode key filters", "client", cl.ID, "error", err)
		return
	}
	h.cfg.Sessions.Put(persistence.KindKeyFilters, key, data)
}

// storedKeyFilters returns the key filters recorded for a persistent session's
// shared subscription, nil when there are none.
func (h *KeyShared) storedKeyFilters(clientID, filter string) []string {
	if h.cfg.Sessions == nil {
		return nil
	}
	data, err := h.cfg.Sessions.Get(persistence.KindKeyFilters, subscriptionKey(clientID, filter))
	if err != nil || data == nil {
		return nil
	}
	var filters []string
	if err := json.Unmarshal(data, &filters); err != nil {
		h.Log.Warn("unreadable stored key filters: the member takes every key", "client", clientID, "filter", filter, "error", err)
		return nil
	}
	return filters
}

func (h *KeyShared) join(cl *mqtt.Client, n share.Name, m *membership) {
	name := n.String()
	g, err := h.ensureGroup(name, n.Share, n.Filter)
	if err != nil {
		h.Log.Error("cannot open group; the member receives nothing from it", "group", name, "client", cl.ID, "error", err)
		return
	}
	h.mu.Lock()
	gs := h.mu.members[cl.ID]
	if gs == nil {
		gs = map[string]*membership{}
		h.mu.members[cl.ID] = gs
	}
	gs[name] = m
	count := h.memberCountLocked(name)
	h.mu.Unlock()
	if err := g.d.AddMember(cl.ID, int(cl.Properties.Props.ReceiveMaximum), m.keyFilters); err != nil {
		h.Log.Error("add member", "group", name, "client", cl.ID, "error", err)
	}
	if err := g.r.AddMember(cl.ID, m.keyFilters); err != nil {
		h.Log.Error("add QoS 0 member", "group", name, "client", cl.ID, "error", err)
	}
	if err := h.store.MembersChanged(name, count, time.Now()); err != nil {
		h.Log.Warn("record group members", "group", name, "error", err)
	}
}

// OnUnsubscribed removes the client from the groups it left; the groups and
// their backlogs stay.
func (h *KeyShared) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	for _, f := range pk.Filters {
		n, ok := groupOf(f.Filter)
		if !ok {
			continue
		}
		h.leave(cl.ID, n.String())
		if h.cfg.Sessions != nil && persistent(cl) {
			h.cfg.Sessions.Delete(persistence.KindKeyFilters, subscriptionKey(cl.ID, f.Filter))
		}
	}
}

func (h *KeyShared) leave(clientID, name string) {
	h.mu.Lock()
	g := h.mu.groups[name]
	if gs := h.mu.members[clientID]; gs != nil {
		delete(gs, name)
		if len(gs) == 0 {
			delete(h.mu.members, clientID)
		}
	}
	n := h.memberCountLocked(name)
	h.mu.Unlock()
	if g == nil {
		return
	}
	if err := g.d.RemoveMember(clientID); err != nil && !errors.Is(err, keyshared.ErrUnknownMember) {
		h.Log.Warn("remove member", "group", name, "client", clientID, "error", err)
	}
	_ = g.r.RemoveMember(clientID)
	if err := h.store.MembersChanged(name, n, time.Now()); err != nil {
		h.Log.Warn("record group members", "group", name, "error", err)
	}
}

// memberships returns the groups a client is a member of.
func (h *KeyShared) memberships(clientID string) map[*ksGroup]*membership {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := map[*ksGroup]*membership{}
	for name, m := range h.mu.members[clientID] {
		if g := h.mu.groups[name]; g != nil {
			out[g] = m
		}
	}
	return out
}

// OnSessionEstablished re-activates the memberships of a resumed session (or,
// after a broker restart, rebuilds them from the restored subscriptions).
func (h *KeyShared) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	known := h.memberships(cl.ID)
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		n, ok := groupOf(filter)
		if !ok {
			continue
		}
		var m *membership
		for g, km := range known {
			if g.name == n.String() {
				m = km
			}
		}
		if m == nil { // not known in memory: the broker restarted since
			m = &membership{qos: sub.Qos, keyFilters: h.storedKeyFilters(cl.ID, filter)}
		}
		h.join(cl, n, m)
	}
}

// OnDisconnect marks the client's memberships inactive: the dispatcher
// evicts the member (requeueing its in-flight messages) unless it comes back
// within the eviction grace.
func (h *KeyShared) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	if cur, ok := h.server.Clients.Get(cl.ID); ok && cur != cl {
		return // taken over: the new connection owns the memberships
	}
	for g := range h.memberships(cl.ID) {
		if err := g.d.SetActive(cl.ID, false); err != nil && !errors.Is(err, keyshared.ErrUnknownMember) {
			h.Log.Warn("mark member inactive", "group", g.name, "client", cl.ID, "error", err)
		}
		_ = g.r.RemoveMember(cl.ID)
	}
}

// OnSelectSubscribers takes mochi's own shared-subscription delivery away:
// Key-Shared delivers every `$share` group.
func (h *KeyShared) OnSelectSubscribers(subs *mqtt.Subscribers, _ packets.Packet) *mqtt.Subscribers {
	for filter := range subs.Shared {
		if filter != placeholderFilter {
			delete(subs.Shared, filter)
		}
	}
	return subs
}

// --- publishing into groups ---

// matchGroups returns the groups whose filter matches topic. Results are
// cached per topic: scanning the index costs more than the rest of a publish.
func (h *KeyShared) matchGroups(topic string) []*ksGroup {
	v := h.indexVersion.Load()
	if c, ok := h.matches.Load(topic); ok && c.(cachedMatch).version == v {
		return c.(cachedMatch).groups
	}
	groups := h.scanGroups(topic)
	if h.matchesSize.Add(1) > maxCachedTopics {
		h.matches.Clear()
		h.matchesSize.Store(1)
	}
	h.matches.Store(topic, cachedMatch{version: v, groups: groups})
	return groups
}

func (h *KeyShared) scanGroups(topic string) []*ksGroup {
	h.mu.RLock()
	defer h.mu.RUnlock()
	subs := h.mu.index.Subscribers(topic)
	if len(subs.Subscriptions) == 0 {
		return nil
	}
	out := make([]*ksGroup, 0, len(subs.Subscriptions))
	for name := range subs.Subscriptions {
		if g := h.mu.groups[name]; g != nil {
			out = append(out, g)
		}
	}
	return out
}

func (h *KeyShared) message(pk packets.Packet) keyshared.Message {
	m := keyshared.Message{
		Topic:       pk.TopicName,
		Key:         pk.TopicName,
		Payload:     pk.Payload,
		QoS:         pk.FixedHeader.Qos,
		PublishedAt: time.Now(),
		Props: keyshared.Properties{
			PayloadFormat:    pk.Properties.PayloadFormat,
			PayloadFormatSet: pk.Properties.PayloadFormatFlag,
			ContentType:      pk.Properties.ContentType,
			ResponseTopic:    pk.Properties.ResponseTopic,
			CorrelationData:  pk.Properties.CorrelationData,
		},
	}
	for _, u := range pk.Properties.User {
		if u.Key == h.cfg.KeyProperty {
			m.Key = u.Val
			break
		}
	}
	if len(pk.Properties.User) > 0 {
		m.Props.User = make([]keyshared.UserProperty, len(pk.Properties.User))
		for i, u := range pk.Properties.User {
			m.Props.User[i] = keyshared.UserProperty{Key: u.Key, Val: u.Val}
		}
	}
	if pk.Expiry > 0 {
		m.ExpiresAt = time.Unix(pk.Expiry, 0)
	} else if pk.Properties.MessageExpiryInterval > 0 {
		m.ExpiresAt = m.PublishedAt.Add(time.Duration(pk.Properties.MessageExpiryInterval) * time.Second)
	}
	return m
}

// OnPublish appends a QoS >= 1 publish to every matching group's log; the
// publisher's PUBACK/PUBREC leaves only once the append is durable (it is
// held in the connection's queue, or, without one, OnPublish waits). A QoS 0
// publish is routed on each group's ring. A refused append is never
// acknowledged as a success: MQTT 5 gets reason 0x97 (backlog full) or 0x80,
// MQTT 3.1.1 is disconnected.
func (h *KeyShared) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	groups := h.matchGroups(pk.TopicName)
	if len(groups) == 0 {
		return pk, nil
	}
	m := h.message(pk)
	if pk.FixedHeader.Qos == 0 || cl.Net.Inline {
		for _, g := range groups {
			g.r.Route(&m)
		}
		return pk, nil
	}
	names := make([]string, len(groups))
	for i, g := range groups {
		names[i] = g.name
	}
	v5 := cl.Properties.ProtocolVersion == 5
	if q, ok := cl.Net.Conn.(*connq.Conn); ok {
		// Do not make the publisher wait for the commit: mochi goes on reading
		// while its acknowledgement waits in the connection's queue until the
		// commit that covers this message is durable (or turns into a failure).
		typ := packets.Puback
		if pk.FixedHeader.Qos == 2 {
			typ = packets.Pubrec
		}
		hold := q.HoldAck(typ, pk.PacketID, v5)
		h.store.AppendMultiAsync(names, m, func(rs []persistence.AppendResult) {
			if err := h.appendFailure(cl, pk.TopicName, rs); err != nil {
				hold.Fail(refusalCode(err).Code)
				return
			}
			hold.Release()
		})
		return pk, nil
	}
	failed := h.appendFailure(cl, pk.TopicName, h.store.AppendMulti(names, m))
	if failed == nil {
		return pk, nil
	}
	if v5 {
		return pk, refusalCode(failed)
	}
	// MQTT 3.1.1 cannot refuse a publish: close the connection without acknowledging it.
	cl.Stop(fmt.Errorf("keyshared: message not stored: %w", failed))
	return pk, packets.ErrRejectPacket
}

// appendFailure logs and counts refused appends and returns the error to
// report, if any (a full backlog wins: it is the one a publisher can act on).
func (h *KeyShared) appendFailure(cl *mqtt.Client, topic string, rs []persistence.AppendResult) error {
	var failed error
	for _, r := range rs {
		if r.Err != nil {
			h.AppendErrors.Add(1)
			h.Log.Warn("group refused a message", "group", r.Group, "topic", topic, "client", cl.ID, "error", r.Err)
			if failed == nil || errors.Is(r.Err, persistence.ErrBacklogFull) {
				failed = r.Err
			}
		}
	}
	return failed
}

// refusalCode is the MQTT 5 reason code for a refused append.
func refusalCode(err error) packets.Code {
	if errors.Is(err, persistence.ErrBacklogFull) {
		return packets.ErrQuotaExceeded
	}
	return packets.ErrUnspecifiedError
}

// --- delivery and acks ---

// groupOut delivers one group's messages to its members.
type groupOut struct {
	h *KeyShared
	g *ksGroup
}

func (o *groupOut) Deliver(member string, m *keyshared.Message, _ int) bool {
	h := o.h
	cl, ok := h.server.Clients.Get(member)
	if !ok || cl.Closed() || cl.Net.Conn == nil {
		return false
	}
	h.mu.RLock()
	ms := h.mu.members[member][o.g.name]
	h.mu.RUnlock()
	if ms == nil {
		return false
	}
	if h.cfg.CanRead != nil && !h.cfg.CanRead(cl, m.Topic) {
		h.Log.Info("member may not read the topic: dead-lettering the message", "group", o.g.name, "client", member, "topic", m.Topic)
		if m.QoS > 0 {
			_ = o.g.d.Reject(member, m.Offset, keyshared.ReasonNotAuthorized)
		}
		return true
	}
	pk := publishPacket(m, min(m.QoS, ms.qos))
	if pk.FixedHeader.Qos == 0 {
		if q, ok := cl.Net.Conn.(*connq.Conn); ok && m.QoS == 0 {
			// QoS 0 routing: a frame the member's queue policy may drop.
			var buf bytes.Buffer
			pk.ProtocolVersion = cl.Properties.ProtocolVersion
			pk.Mods.AllowResponseInfo = true
			if err := pk.PublishEncode(&buf); err != nil {
				return false
			}
			return q.Enqueue(buf.Bytes())
		}
		if err := cl.WritePacket(pk); err != nil {
			return false
		}
		if m.QoS > 0 {
			_ = o.g.d.Ack(member, m.Offset) // a QoS 0 member cannot acknowledge: written is done
		}
		return true
	}
	id, err := cl.NextPacketID()
	if err != nil {
		return false
	}
	pk.PacketID = uint16(id)
	h.track(cl.ID, pk.PacketID, o.g, m.Offset)
	if cl.State.Inflight.Set(pk) {
		atomic.AddInt64(&h.server.Info.Inflight, 1)
	}
	if err := cl.WritePacket(pk); err != nil {
		h.untrack(cl.ID, pk.PacketID)
		if cl.State.Inflight.Delete(pk.PacketID) {
			atomic.AddInt64(&h.server.Info.Inflight, -1)
		}
		return false
	}
	return true
}

func (o *groupOut) Revoke(member string, offset uint64) {
	h := o.h
	h.inflight.Lock()
	id, ok := h.inflight.byOffset[offsetKey{o.g.name, member, offset}]
	if ok {
		delete(h.inflight.byOffset, offsetKey{o.g.name, member, offset})
		delete(h.inflight.byPacket, packetKey{member, id})
	}
	h.inflight.Unlock()
	if !ok {
		return
	}
	if cl, found := h.server.Clients.Get(member); found && cl.State.Inflight.Delete(id) {
		atomic.AddInt64(&h.server.Info.Inflight, -1)
	}
}

func publishPacket(m *keyshared.Message, qos byte) packets.Packet {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos},
		TopicName:   m.Topic,
		Payload:     m.Payload,
		Created:     m.PublishedAt.Unix(),
		Properties: packets.Properties{
			PayloadFormat:     m.Props.PayloadFormat,
			PayloadFormatFlag: m.Props.PayloadFormatSet,
			ContentType:       m.Props.ContentType,
			ResponseTopic:     m.Props.ResponseTopic,
			CorrelationData:   m.Props.CorrelationData,
		},
	}
	if !m.ExpiresAt.IsZero() {
		pk.Expiry = m.ExpiresAt.Unix() // mochi turns it into the remaining interval when it writes
	}
	if len(m.Props.User) > 0 {
		pk.Properties.User = make([]packets.UserProperty, len(m.Props.User))
		for i, u := range m.Props.User {
			pk.Properties.User[i] = packets.UserProperty{Key: u.Key, Val: u.Val}
		}
	}
	return pk
}

func (h *KeyShared) track(client string, id uint16, g *ksGroup, offset uint64) {
	h.inflight.Lock()
	h.inflight.byPacket[packetKey{client, id}] = delivery{group: g, offset: offset}
	h.inflight.byOffset[offsetKey{g.name, client, offset}] = id
	h.inflight.Unlock()
}

func (h *KeyShared) untrack(client string, id uint16) (delivery, bool) {
	h.inflight.Lock()
	defer h.inflight.Unlock()
	d, ok := h.inflight.byPacket[packetKey{client, id}]
	if ok {
		delete(h.inflight.byPacket, packetKey{client, id})
		delete(h.inflight.byOffset, offsetKey{d.group.name, client, d.offset})
	}
	return d, ok
}

// Owns reports whether a client's packet id belongs to a Key-Shared delivery
// (the storage hook leaves those out: the group log is their durable copy).
func (h *KeyShared) Owns(client string, id uint16) bool {
	h.inflight.Lock()
	defer h.inflight.Unlock()
	_, ok := h.inflight.byPacket[packetKey{client, id}]
	return ok
}

// OnPacketRead reads members' acknowledgements: PUBACK and PUBCOMP ack,
// an MQTT 5 PUBACK or PUBREC with a reason code >= 0x80 nacks (0x87 and 0x99
// reject without retry).
func (h *KeyShared) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	t := pk.FixedHeader.Type
	if t != packets.Puback && t != packets.Pubrec && t != packets.Pubcomp {
		return pk, nil
	}
	failed := cl.Properties.ProtocolVersion == 5 && pk.ReasonCode >= packets.ErrUnspecifiedError.Code
	if t == packets.Pubrec && !failed {
		return pk, nil // QoS 2 goes on to PUBREL/PUBCOMP
	}
	d, ok := h.untrack(cl.ID, pk.PacketID)
	if !ok {
		return pk, nil
	}
	switch {
	case !failed:
		_ = d.group.d.Ack(cl.ID, d.offset)
	case keyshared.NeverRetry(pk.ReasonCode):
		_ = d.group.d.Reject(cl.ID, d.offset, pk.ReasonCode)
	default:
		_ = d.group.d.Nack(cl.ID, d.offset, pk.ReasonCode)
	}
	return pk, nil
}

// --- dead letters ---

// dlqLog stores dead letters through the group log, then publishes each live
// to $dlq/<share name>/<original topic>.
type dlqLog struct {
	keyshared.Log
	h     *KeyShared
	group string
}

func (l *dlqLog) DeadLetter(d keyshared.DeadLetter) error {
	if err := l.Log.DeadLetter(d); err != nil {
		return err
	}
	l.h.publishDeadLetter(l.group, d)
	return nil
}

func (h *KeyShared) publishDeadLetter(group string, d keyshared.DeadLetter) {
	m := d.Message
	m.QoS = 1
	pk := publishPacket(&m, 1)
	pk.PacketID = 1 // mochi validates it; an inline client's publish tracks no packet id
	share, _, _ := strings.Cut(group, "/")
	pk.TopicName = DLQPrefix + share + "/" + strings.TrimPrefix(m.Topic, "/")
	pk.Expiry = 0
	pk.Properties.User = append(pk.Properties.User,
		packets.UserProperty{Key: "dlq-group", Val: group},
		packets.UserProperty{Key: "dlq-key", Val: m.Key},
		packets.UserProperty{Key: "dlq-attempts", Val: fmt.Sprint(d.Attempts)},
		packets.UserProperty{Key: "dlq-reason", Val: fmt.Sprintf("0x%02x", d.Reason)},
		packets.UserProperty{Key: "dlq-offset", Val: fmt.Sprint(m.Offset)},
	)
	if err := h.server.InjectPacket(h.inline, pk); err != nil {
		h.Log.Warn("publish dead letter", "group", group, "topic", pk.TopicName, "error", err)
	}
}

// Members returns the ids of a group's members, sorted.
func (h *KeyShared) Members(group string) []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []string
	for id, gs := range h.mu.members {
		if _, ok := gs[group]; ok {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}
