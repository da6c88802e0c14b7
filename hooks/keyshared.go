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

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
)

// KeyFilterProperty is the MQTT 5 SUBSCRIBE user property that carries a
// member's key filter (repeatable; glob patterns with * and ?).
const KeyFilterProperty = "key-filter"

// KeySharedConfig configures the Key-Shared hook.
type KeySharedConfig struct {
	// KeyProperty names the MQTT 5 user property holding a message's routing
	// key; a message without it is keyed by its topic.
	KeyProperty string
	// GroupSettings returns the dispatcher and storage settings of a group
	// (global settings with the group's overrides applied).
	GroupSettings func(group string) (keyshared.Config, keyshared.GroupConfig)
	// CanRead reports whether a client may receive a message on a topic; nil allows all.
	CanRead func(cl *mqtt.Client, topic string) bool
	// KeyFilters, when set, keeps the key filters of persistent sessions'
	// memberships, so that a session resumed after a restart or on another
	// node keeps them.
	KeyFilters KeyFilterStore
	// MaxKeySize bounds a message's routing key in bytes (0: no bound). A
	// longer key is refused: MQTT 5 PUBACK/PUBREC 0x99, a 3.1.1 QoS 1/2
	// publisher is disconnected, QoS 0 is dropped; all counted.
	MaxKeySize int
	// MaxGroups bounds the groups (0: no bound); MaxGroupsPerClient the
	// groups one client is a member of. A SUBSCRIBE past either gets 0x97
	// (3.1.1: 0x80).
	MaxGroups, MaxGroupsPerClient int
	// MaxGroupsPerOwner bounds the groups that the clients of one owner
	// (GroupOwner) have created and that still run (0: no bound), so that
	// throwaway client ids cannot take every group: a SUBSCRIBE that would
	// create one more gets 0x97. Groups resumed from the store have no owner.
	MaxGroupsPerOwner int
	// GroupOwner names whom a client's new groups count against (its user,
	// or its address); "" counts them against nobody. Nil: nobody.
	GroupOwner func(cl *mqtt.Client) string
	// AllocPacketID, when set, picks the packet id of a delivery and calls
	// set with it while no other delivery to the client can pick the same
	// (the fan-out's session outbox shares the id space); false: none free
	// now. Nil: mochi's Client.NextPacketID.
	AllocPacketID func(cl *mqtt.Client, set func(id uint16)) (uint16, bool)
}

// KeyShared dispatches `$share/<group>/<filter>` subscriptions Key-Shared: it
// is the mochi glue between MQTT clients and the groups of a
// keyshared.Backend (one node's data dir, or the cluster), whose Group for
// each group dispatches, wherever its dispatcher runs. The mochi callbacks
// are in this file; the state they act on is split by owner:
//   - groupRegistry (ks_groups.go): the running groups and the topic index;
//   - memberships (ks_members.go): which client is a member of which group;
//   - inflightTable (ks_inflight.go): packet ids of deliveries awaiting acks;
//   - groupOut (ks_deliver.go): writes deliveries to members' connections;
//   - dlqPublisher (ks_dlq.go): publishes dead letters live on $dlq/...;
//   - the publish path (ks_publish.go) and the admin face (keyshared_admin.go).
type KeyShared struct {
	mqtt.HookBase
	server  *mqtt.Server
	backend keyshared.Backend
	cfg     KeySharedConfig

	groups  *groupRegistry
	members *memberships
	// reaping orders joins against deletions: a join holds it shared from
	// finding its group to adding the member, a deletion (DeleteGroup,
	// SweepIdle) exclusively from deciding to its dispatcher stopped. A
	// member joining while its group is swept would otherwise join the
	// dispatcher being closed and receive nothing, its subscription granted.
	reaping sync.RWMutex
	// joinWaits, when set (tests), runs when a join must wait for a deletion.
	joinWaits func()
	inflight  *inflightTable
	dlq       *dlqPublisher
	// acks, when the backend tells the end of each commit's callbacks
	// (keyshared.Backend.OnCommitted), holds the publishers'
	// acknowledgements a commit released until its callbacks have all run:
	// each publisher's then go with one write, made there when its
	// connection's writer is idle.
	acks *connq.Flusher
	// injectors are the bridges' inline clients (ks_internal.go).
	injectors injectors

	// AppendErrors counts QoS >= 1 publishes a group log refused.
	AppendErrors atomic.Uint64
	// KeysTooLong counts publishes refused for a routing key over MaxKeySize.
	KeysTooLong atomic.Uint64
	// GroupsRefused counts shared subscriptions refused at MaxGroups or
	// MaxGroupsPerClient.
	GroupsRefused atomic.Uint64
	// ResultsDropped counts acks, nacks and rejects that reached a group's
	// dispatcher after it closed (the broker stopping, the group deleted or
	// idle): each such message is delivered again when the group runs again.
	ResultsDropped atomic.Uint64
}

// NewKeyShared returns the Key-Shared hook over backend. Add it to the
// server before Serve; its Init opens every group the backend holds.
func NewKeyShared(server *mqtt.Server, backend keyshared.Backend, cfg KeySharedConfig) *KeyShared {
	h := &KeyShared{server: server, backend: backend, cfg: cfg,
		groups: newGroupRegistry(), inflight: newInflightTable()}
	h.members = newMemberships()
	h.dlq = newDLQPublisher(server, h)
	return h
}

// ID returns the hook's id.
func (h *KeyShared) ID() string { return "keyline-keyshared" }

// Provides reports which hook methods KeyShared implements.
func (h *KeyShared) Provides(b byte) bool { return keySharedEvents.has(b) }

var keySharedEvents = eventSet(
	mqtt.OnSubscribe, mqtt.OnSubscribed, mqtt.OnUnsubscribed,
	mqtt.OnSessionEstablished, mqtt.OnDisconnect,
	mqtt.OnPublish, mqtt.OnSelectSubscribers,
)

// Init opens every group the backend holds, so publishes keep landing in
// groups whose members are away.
func (h *KeyShared) Init(any) error {
	if acks := new(connq.Flusher); h.backend.OnCommitted(acks.Flush) {
		h.acks = acks
	}
	infos, err := h.backend.Groups()
	if err != nil {
		return fmt.Errorf("keyshared hook: list groups: %w", err)
	}
	for _, gi := range infos {
		n, err := share.Parse(gi.Name)
		if err != nil {
			return fmt.Errorf("keyshared hook: stored group: %w", err)
		}
		if _, err := h.ensureGroup(n); err != nil {
			return err
		}
	}
	return nil
}

// Stop closes every dispatcher; each hands its last resolutions to the log.
func (h *KeyShared) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, g := range h.groups.removeAll() {
		if err := g.d.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("group %s: %w", g.name, err))
		}
	}
	return errors.Join(errs...)
}

// ensureGroup returns the running group, creating the group in the backend
// and opening this node's side of it if needed (the backend commits a new
// group without any lock of the hook held).
func (h *KeyShared) ensureGroup(n share.Name) (*ksGroup, error) { return h.openGroup(n, true) }

// openGroup returns the running group, opening this node's side of it if
// needed; create makes the group exist first (else a group that does not
// exist, being deleted for instance, stays closed).
func (h *KeyShared) openGroup(n share.Name, create bool) (*ksGroup, error) {
	name := n.String()
	return h.groups.ensure(name, func() (*ksGroup, error) {
		dcfg, gcfg := h.cfg.GroupSettings(name)
		if create {
			if _, err := h.backend.EnsureGroup(name, gcfg); err != nil {
				return nil, fmt.Errorf("keyshared hook: group %s: %w", name, err)
			}
		}
		g := &ksGroup{name: name, n: n}
		dcfg.Group = name
		if dcfg.Logger == nil {
			dcfg.Logger = h.Log
		}
		d, err := h.backend.Open(name, dcfg, &groupOut{h: h, g: g, fl: new(connq.Flusher)})
		if err != nil {
			return nil, fmt.Errorf("keyshared hook: group %s: %w", name, err)
		}
		g.d = d
		return g, nil
	})
}

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

// OnSubscribe invalidates malformed shared subscriptions (bad share name or
// filter, bad or too many key filters) so that mochi answers them 0x8F
// Topic Filter invalid.
func (h *KeyShared) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	var filtersErr error
	kf := keyFilters(pk)
	if len(kf) > keyshared.MaxFilters {
		filtersErr = fmt.Errorf("%w: %d key filters, at most %d", keyshared.ErrInvalidFilter, len(kf), keyshared.MaxFilters)
	}
	for _, f := range kf {
		if err := keyshared.ValidateFilter(f); err != nil && filtersErr == nil {
			filtersErr = err
		}
	}
	for i, f := range pk.Filters {
		_, shared, err := share.ParseSubscription(f.Filter)
		switch {
		case !shared:
			continue
		case err != nil:
			h.Log.Info("refusing shared subscription: want $share/<share name>/<topic filter>", "client", cl.ID, "filter", clip(f.Filter), "error", err)
		case filtersErr != nil:
			h.Log.Info("refusing shared subscription: invalid key filter", "client", cl.ID, "filter", clip(f.Filter), "error", filtersErr)
		default:
			continue
		}
		pk.Filters[i].Filter = "" // mochi answers an invalid filter with 0x8F
	}
	return pk
}

// groupOf returns the group of a well-formed shared subscription filter.
func groupOf(filter string) (share.Name, bool) {
	n, shared, err := share.ParseSubscription(filter)
	return n, shared && err == nil
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
		if why := h.overGroupLimits(cl, n.String()); why != "" {
			h.GroupsRefused.Add(1)
			h.Log.Info("refusing a shared subscription: "+why, "client", clip(cl.ID), "filter", clip(f.Filter))
			refuseSubscription(h.server, cl, f.Filter, reasonCodes, i, packets.ErrQuotaExceeded)
			continue
		}
		created := h.groups.get(n.String()) == nil
		if err := h.saveKeyFilters(cl, f.Filter, filters); err != nil {
			h.Log.Error("key filters not stored; refusing the subscription", "client", clip(cl.ID), "filter", clip(f.Filter), "error", err)
			refuseSubscription(h.server, cl, f.Filter, reasonCodes, i, packets.ErrUnspecifiedError)
			continue
		}
		if err := h.join(cl, n, &membership{qos: reasonCodes[i], keyFilters: filters, subID: f.Identifier}); err != nil {
			// Refused rather than granted and silent: the client sees 0x80
			// in its SUBACK and can subscribe again.
			h.Log.Error("cannot open group; refusing the subscription", "group", n.String(), "client", clip(cl.ID), "error", err)
			refuseSubscription(h.server, cl, f.Filter, reasonCodes, i, packets.ErrUnspecifiedError)
			continue
		}
		if owner := h.owner(cl); created && owner != "" {
			h.groups.claim(n.String(), owner)
		}
	}
}

// owner returns whom cl's new groups count against ("": nobody).
func (h *KeyShared) owner(cl *mqtt.Client) string {
	if h.cfg.GroupOwner == nil {
		return ""
	}
	return h.cfg.GroupOwner(cl)
}

// overGroupLimits says why cl may not join group name, "" if it may.
func (h *KeyShared) overGroupLimits(cl *mqtt.Client, name string) string {
	if h.members.get(cl.ID, name) != nil {
		return "" // already a member: a re-subscribe
	}
	if max := h.cfg.MaxGroupsPerClient; max > 0 && h.members.groupsOf(cl.ID) >= max {
		return fmt.Sprintf("the client is a member of %d groups already (max-groups-per-client)", max)
	}
	if h.groups.get(name) != nil {
		return "" // joining a group that exists takes no new one
	}
	if max, owner := h.cfg.MaxGroupsPerOwner, h.owner(cl); max > 0 && owner != "" && h.groups.owned(owner) >= max {
		return fmt.Sprintf("%s has created %d groups already (max-groups-per-user)", owner, max)
	}
	if max := h.cfg.MaxGroups; max > 0 && h.groups.count() >= max {
		return fmt.Sprintf("the broker holds %d groups already (max-groups)", max)
	}
	return ""
}

// join makes cl a member of group n; it fails when the group cannot be opened.
func (h *KeyShared) join(cl *mqtt.Client, n share.Name, m *membership) error {
	if !h.reaping.TryRLock() {
		if h.joinWaits != nil {
			h.joinWaits()
		}
		h.reaping.RLock()
	}
	defer h.reaping.RUnlock()
	g, err := h.ensureGroup(n)
	if err != nil {
		return err
	}
	h.members.set(cl.ID, g.name, m)
	opts := keyshared.MemberOptions{ReceiveMaximum: int(cl.Properties.Props.ReceiveMaximum), KeyFilters: m.keyFilters, QoS: m.qos}
	if h.cfg.CanRead != nil {
		opts.CanRead = func(topic string) bool { return h.cfg.CanRead(cl, topic) }
	}
	// A message larger than the member's Maximum Packet Size is not for
	// it: another member gets it, or it waits (it was dead-lettered).
	opts.Limit = keyshared.PacketLimit{Max: maxPacketSize(cl), Version: cl.Properties.ProtocolVersion, SubscriptionID: m.subID}
	opts.Fits = KeySharedFits(opts.Limit, m.qos)
	if err := g.d.AddMember(cl.ID, opts); err != nil {
		h.Log.Error("add member", "group", g.name, "client", cl.ID, "error", err)
	}
	return nil
}

// KeySharedFits is the Fits of a Key-Shared member with limit l subscribed
// at qos (nil: no limit): whether a delivery of a message to it is within
// its Maximum Packet Size. A cluster's holder makes it from what the
// member's node reported (cluster.GroupsConfig.Fits).
func KeySharedFits(l keyshared.PacketLimit, qos byte) func(*keyshared.Message) bool {
	if l.Max == 0 {
		return nil
	}
	var ids []int
	if l.SubscriptionID > 0 && l.Version == 5 {
		ids = []int{l.SubscriptionID} // as deliver sends them
	}
	return func(msg *keyshared.Message) bool {
		return fits(l.Max, deliveryLen(msg, l.Version, min(msg.QoS, qos), ids))
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
		if h.cfg.KeyFilters != nil {
			h.cfg.KeyFilters.ForgetKeyFilters(cl, f.Filter)
		}
	}
}

func (h *KeyShared) leave(clientID, name string) {
	_, was := h.members.remove(clientID, name)
	g := h.groups.get(name)
	if g == nil || !was {
		return
	}
	if err := g.d.RemoveMember(clientID); err != nil && !errors.Is(err, keyshared.ErrUnknownMember) {
		h.Log.Warn("remove member", "group", name, "client", clientID, "error", err)
	}
}

// OnSessionEstablished re-activates the memberships of a resumed session (or,
// after a broker restart, rebuilds them from the restored subscriptions).
func (h *KeyShared) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	known := h.members.of(cl.ID)
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		n, ok := groupOf(filter)
		if !ok {
			continue
		}
		m := known[n.String()]
		if m == nil { // not known in memory: the broker restarted since
			m = &membership{qos: sub.Qos, keyFilters: h.storedKeyFilters(cl, filter), subID: sub.Identifier}
		}
		if err := h.join(cl, n, m); err != nil {
			// The session keeps its subscription; the member gets nothing
			// from the group until it subscribes again or reconnects.
			h.Log.Error("cannot open group; the resumed member receives nothing from it until it subscribes again", "group", n.String(), "client", clip(cl.ID), "error", err)
		}
	}
}

// Forget ends the client's memberships on this node at once, keeping what
// is stored of them: its session moved to another node (cluster mode),
// which rejoins its groups from the session's record.
func (h *KeyShared) Forget(clientID string) {
	for name := range h.members.of(clientID) {
		h.leave(clientID, name)
	}
}

// OnDisconnect marks the client's memberships inactive: the dispatcher
// evicts the member (requeueing its in-flight messages) unless it comes back
// within the eviction grace.
func (h *KeyShared) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	if cur, ok := h.server.Clients.Get(cl.ID); ok && cur != cl {
		return // taken over: the new connection owns the memberships
	}
	for name := range h.members.of(cl.ID) {
		g := h.groups.get(name)
		if g == nil {
			continue
		}
		if err := g.d.SetActive(cl.ID, false); err != nil && !errors.Is(err, keyshared.ErrUnknownMember) {
			h.Log.Warn("mark member inactive", "group", name, "client", cl.ID, "error", err)
		}
	}
}

// saveKeyFilters records a persistent session's key filters for a shared
// subscription before its SUBACK.
func (h *KeyShared) saveKeyFilters(cl *mqtt.Client, filter string, filters []string) error {
	if h.cfg.KeyFilters == nil {
		return nil
	}
	return h.cfg.KeyFilters.SaveKeyFilters(cl, filter, filters)
}

// storedKeyFilters returns the key filters recorded for a persistent session's
// shared subscription, nil when there are none.
func (h *KeyShared) storedKeyFilters(cl *mqtt.Client, filter string) []string {
	if h.cfg.KeyFilters == nil {
		return nil
	}
	return h.cfg.KeyFilters.KeyFilters(cl, filter)
}

// --- publishes and acks ---

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

// OnPublish appends a publish to the logs of the groups it matches, or
// routes it on their rings at QoS 0 (ks_publish.go).
func (h *KeyShared) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.injectors.has(cl) {
		return pk, nil // its Injector did the groups
	}
	groups := h.groups.match(pk.TopicName)
	if len(groups) == 0 {
		return pk, nil
	}
	return h.publish(cl, pk, groups)
}

// Owns reports whether a client's packet id belongs to a Key-Shared delivery
// (the storage hook leaves those out: the group log is their durable copy).
func (h *KeyShared) Owns(client string, id uint16) bool { return h.inflight.owns(client, id) }

// ReadPacket (a PacketReader step) reads members' acknowledgements: PUBACK
// and PUBCOMP ack, an MQTT 5 PUBACK or PUBREC with a reason code >= 0x80
// nacks (0x87 and 0x99 reject without retry).
func (h *KeyShared) ReadPacket(cl *mqtt.Client, pk *packets.Packet) {
	t := pk.FixedHeader.Type
	if t != packets.Puback && t != packets.Pubrec && t != packets.Pubcomp {
		return
	}
	failed := cl.Properties.ProtocolVersion == 5 && pk.ReasonCode >= packets.ErrUnspecifiedError.Code
	if t == packets.Pubrec && !failed {
		return // QoS 2 goes on to PUBREL/PUBCOMP
	}
	d, ok := h.inflight.untrack(cl.ID, pk.PacketID)
	if !ok {
		return
	}
	var err error
	switch {
	case !failed:
		err = d.group.d.Ack(cl.ID, d.offset)
	case keyshared.NeverRetry(pk.ReasonCode):
		err = d.group.d.Reject(cl.ID, d.offset, pk.ReasonCode)
	default:
		err = d.group.d.Nack(cl.ID, d.offset, pk.ReasonCode)
	}
	h.resultDropped(d.group, cl.ID, d.offset, err)
}

// resultDropped counts and logs a member's ack, nack or reject its group's
// dispatcher did not take (err != nil: ErrClosed, the only error they
// return). Nothing is lost: the message is still unresolved in the log.
func (h *KeyShared) resultDropped(g *ksGroup, member string, offset uint64, err error) {
	if err == nil {
		return
	}
	h.ResultsDropped.Add(1)
	h.Log.Debug("keyshared: a member's answer reached a closed group; the message will be delivered again",
		"group", g.name, "client", clip(member), "offset", offset, "error", err)
}
