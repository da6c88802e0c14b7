package hooks

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
)

// The broker's own groups and publishes, for bridges to other brokers.
//
// An internal group (share name with share.InternalPrefix) is a Key-Shared
// group like any other: its log takes every QoS >= 1 publish its filter
// matches before the publisher is acknowledged, it has a cursor, backlog
// limits and dead letters, and in cluster mode one dispatcher in the cluster
// under a lease. What differs: no client can join or name it (share.ParseSubscription
// refuses it), listings leave it out, its dead letters are not published on
// $dlq/, and its members are in-process (a bridge's remote connection), not
// mochi clients: deliveries go to the Deliverer attached with OpenInternal.
//
// An Injector publishes into the broker what a bridge brings in, as the
// broker's own client (no ACL: the bridge's topic rules decide), with the
// Key-Shared part done first and synchronously so that the bridge can
// acknowledge the remote only once the message is durable.

// internalPrefix is share.InternalPrefix, for files where "share" names a string.
const internalPrefix = share.InternalPrefix

// internalOut is the Deliverer an internal group's deliveries go to.
type internalOut struct{ d keyshared.Deliverer }

// deliverInternal hands a delivery of an internal group to its attached
// Deliverer; before one is attached the group takes nothing (its members can
// only be in-process ones, added after attaching).
func (g *ksGroup) deliverInternal(member string, m *keyshared.Message, attempt int) bool {
	if x := g.ext.Load(); x != nil {
		return x.d.Deliver(member, m, attempt)
	}
	return false
}

func (g *ksGroup) revokeInternal(member string, offset uint64) {
	if x := g.ext.Load(); x != nil {
		x.d.Revoke(member, offset)
	}
}

// InternalGroup is an internal group as its in-process member sees it.
// Safe for concurrent use; Ack, Nack and Reject never wait.
type InternalGroup struct {
	h *KeyShared
	g *ksGroup
}

// ErrNotInternal is returned by OpenInternal for a group name without
// share.InternalPrefix.
var ErrNotInternal = errors.New("keyshared hook: not an internal group")

// OpenInternal opens the internal group n, creating it (with the settings
// KeySharedConfig.GroupSettings gives its name) if it does not exist, and
// sends its deliveries to out from then on. The group counts as having a
// member while it is open, so the idle TTL never deletes it. Deliveries
// start once a member is added (InternalGroup.AddMember). (No backend's
// idle sweep deletes an internal group: keyshared.Backend's contract.)
func (h *KeyShared) OpenInternal(n share.Name, out keyshared.Deliverer) (*InternalGroup, error) {
	if !n.Internal() {
		return nil, fmt.Errorf("%w: %s", ErrNotInternal, n)
	}
	g, err := h.ensureGroup(n)
	if err != nil {
		return nil, err
	}
	g.ext.Store(&internalOut{d: out})
	return &InternalGroup{h: h, g: g}, nil
}

// Name returns the group's name.
func (ig *InternalGroup) Name() string { return ig.g.name }

// AddMember adds the in-process member id, which takes at most recvMax
// messages in flight (0: the group's member-max-inflight).
func (ig *InternalGroup) AddMember(id string, recvMax int) error {
	return ig.g.d.AddMember(id, keyshared.MemberOptions{ReceiveMaximum: recvMax, QoS: 2})
}

// RemoveMember removes member id: what it held is requeued at the head of
// its keys. An unknown member is not an error.
func (ig *InternalGroup) RemoveMember(id string) error {
	if err := ig.g.d.RemoveMember(id); err != nil && !errors.Is(err, keyshared.ErrUnknownMember) {
		return err
	}
	return nil
}

// Ack resolves offset, delivered to member.
func (ig *InternalGroup) Ack(member string, offset uint64) { _ = ig.g.d.Ack(member, offset) }

// Nack retries offset after backoff; a never-retry reason dead-letters it.
func (ig *InternalGroup) Nack(member string, offset uint64, reason byte) {
	if keyshared.NeverRetry(reason) {
		_ = ig.g.d.Reject(member, offset, reason)
		return
	}
	_ = ig.g.d.Nack(member, offset, reason)
}

// Reject dead-letters offset at once.
func (ig *InternalGroup) Reject(member string, offset uint64, reason byte) {
	_ = ig.g.d.Reject(member, offset, reason)
}

// Stats returns the group's live dispatch figures and the QoS 0 routing ones.
func (ig *InternalGroup) Stats() (keyshared.Stats, keyshared.RouterStats) {
	return ig.g.d.Stats(), ig.g.d.RouterStats()
}

// Info returns the group's stored figures (backlog, bytes, dead letters).
func (ig *InternalGroup) Info() (keyshared.GroupInfo, error) { return ig.h.backend.Group(ig.g.name) }

// Holder returns the node holding the group's lease in cluster mode ("" on
// one node), and whether a dispatcher serves the group now.
func (ig *InternalGroup) Holder() (node string, dispatching bool) { return ig.g.d.Holder() }

// HeldHere reports whether this node dispatches the group now (in a
// cluster: holds its lease by its own clock, not a read of the lease);
// always true on one node.
func (ig *InternalGroup) HeldHere() bool { return ig.g.d.HeldHere() }

// Close detaches the in-process member's Deliverer; the group and its
// backlog stay, and it goes on taking publishes. Remove members first.
func (ig *InternalGroup) Close() { ig.g.ext.Store(nil) }

// --- publishing into the broker ---

// bridgeClientPrefix starts the ids of injectors' inline clients (U+0000:
// no client can take one).
const bridgeClientPrefix = "\x00keyline-bridge:"

// forwardedInline reports whether an inline client's publishes go to the
// other nodes of a cluster like a client's: dead letters, what bridges
// bring in and the wills of gone nodes' clients do; what other nodes sent
// does not.
func forwardedInline(id string) bool {
	return id == dlqClientID || id == clusterWillClient || strings.HasPrefix(id, bridgeClientPrefix)
}

// injectors is the set of inline clients whose publishes the Key-Shared hook
// leaves alone: their Injector did the groups already.
type injectors struct{ m sync.Map } // *mqtt.Client -> struct{}

func (s *injectors) has(cl *mqtt.Client) bool {
	if !cl.Net.Inline {
		return false
	}
	_, ok := s.m.Load(cl)
	return ok
}

// Injector publishes messages into the broker for one bridge.
type Injector struct {
	h    *KeyShared
	cl   *mqtt.Client
	skip func(group string) bool
	// pubMu serialises InjectPacket: mochi's inline client is one client.
	pubMu sync.Mutex
	// Refused counts publishes a group refused (backlog full, store error).
	Refused atomic.Uint64
}

// NewInjector returns an injector for bridge name. skip names the groups its
// publishes must not go to (the bridge's own outbound groups: a message
// brought in is never sent back out through the same bridge).
func (h *KeyShared) NewInjector(name string, skip func(group string) bool) *Injector {
	cl := h.server.NewClient(nil, mqtt.LocalListener, bridgeClientPrefix+name, true)
	cl.Properties.ProtocolVersion = 5
	h.injectors.m.Store(cl, struct{}{})
	return &Injector{h: h, cl: cl, skip: skip}
}

// Publish publishes m (topic, payload, QoS, properties, expiry; its offset
// and key are ignored) as the broker's own client. A QoS 1/2 message is
// appended to the logs of the groups it matches (but those skip names)
// before Publish returns; an error means a group refused it
// (persistence.ErrBacklogFull when a backlog is full) and nothing was
// delivered. Then mochi delivers it to subscribers (and, in cluster mode, to
// the other nodes) as it does the broker's own publishes. QoS 0 is routed on
// the groups' rings.
func (in *Injector) Publish(msg *keyshared.Message, retain bool) error {
	h := in.h
	pk := publishPacket(msg, msg.QoS)
	pk.FixedHeader.Retain = retain
	if pk.FixedHeader.Qos > 0 {
		pk.PacketID = 1 // mochi validates it; an inline client's publish tracks none
	}
	if !msg.ExpiresAt.IsZero() {
		pk.Properties.MessageExpiryInterval = uint32(max(time.Until(msg.ExpiresAt)/time.Second, 1))
	}
	var groups []*ksGroup
	for _, g := range h.groups.match(pk.TopicName) {
		if !in.skip(g.name) {
			groups = append(groups, g)
		}
	}
	if len(groups) > 0 {
		m := h.message(pk)
		if max := h.cfg.MaxKeySize; max > 0 && len(m.Key) > max {
			h.KeysTooLong.Add(1)
			in.Refused.Add(1)
			return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(m.Key), max)
		}
		if pk.FixedHeader.Qos == 0 {
			for _, g := range groups {
				g.d.Route(&m)
			}
		} else {
			names := make([]string, len(groups))
			for i, g := range groups {
				names[i] = g.name
			}
			if err := h.appendFailure(in.cl, pk.TopicName, keyshared.AppendMulti(h.backend, names, m)); err != nil {
				in.Refused.Add(1)
				return err
			}
		}
	}
	in.pubMu.Lock()
	defer in.pubMu.Unlock()
	return h.server.InjectPacket(in.cl, pk)
}

// Close forgets the injector's client.
func (in *Injector) Close() { in.h.injectors.m.Delete(in.cl) }

// ErrKeyTooLong is an Injector's error for a message whose routing key is
// longer than KeySharedConfig.MaxKeySize.
var ErrKeyTooLong = errors.New("keyshared hook: routing key too long")
