package cluster

import (
	"context"
	"slices"
	"strings"

	"github.com/keyline-mq/keyline/keyshared"
)

// Group is a cluster-wide Key-Shared group as one node's broker sees it
// (keyshared.Group): members connected here, whose calls go to the group's
// one dispatcher wherever its lease holder runs. Safe for concurrent use;
// Ack, Nack, Reject and Route never wait.
type Group struct{ ng *nodeGroup }

var _ keyshared.Group = (*Group)(nil)

// AddMember makes a client connected to this node a member (or updates
// its options, as a re-subscribe does).
func (gr *Group) AddMember(id string, o keyshared.MemberOptions) error {
	qos := o.QoS
	if id == "" {
		return keyshared.ErrInvalidMember
	}
	for _, f := range o.KeyFilters {
		if err := keyshared.ValidateFilter(f); err != nil {
			return err
		}
	}
	ng := gr.ng
	m := &localMember{opts: o, qos: qos, active: true}
	ng.mu.Lock()
	ng.mu.members[id] = m
	ng.postLocked(joinItem(id, m))
	ng.mu.Unlock()
	ng.flush()
	return nil
}

// RemoveMember removes a member that left: the holder requeues what it
// held and revokes it here.
func (gr *Group) RemoveMember(id string) error {
	ng := gr.ng
	ng.mu.Lock()
	_, ok := ng.mu.members[id]
	delete(ng.mu.members, id)
	if ok {
		ng.postLocked(upItem{kind: upLeave, member: id})
	}
	ng.mu.Unlock()
	if !ok {
		return keyshared.ErrUnknownMember
	}
	ng.flush()
	return nil
}

// SetActive marks a member disconnected or back.
func (gr *Group) SetActive(id string, active bool) error {
	ng := gr.ng
	ng.mu.Lock()
	m := ng.mu.members[id]
	if m != nil {
		m.active = active
		ng.postLocked(upItem{kind: upActive, member: id, active: active})
	}
	ng.mu.Unlock()
	if m == nil {
		return keyshared.ErrUnknownMember
	}
	ng.flush()
	return nil
}

// Ack reports a member's PUBACK/PUBCOMP.
func (gr *Group) Ack(member string, offset uint64) error {
	return gr.answer(upItem{kind: upAck, member: member, offset: offset})
}

// Nack reports a member's failure reason code (retried after backoff).
func (gr *Group) Nack(member string, offset uint64, reason byte) error {
	return gr.answer(upItem{kind: upNack, member: member, offset: offset, reason: reason})
}

// Reject reports a never-retry answer (dead-lettered at once).
func (gr *Group) Reject(member string, offset uint64, reason byte) error {
	return gr.answer(upItem{kind: upReject, member: member, offset: offset, reason: reason})
}

func (gr *Group) answer(it upItem) error {
	ng := gr.ng
	ng.mu.Lock()
	delete(ng.mu.outstanding, delivery{it.member, it.offset})
	ng.mu.Unlock()
	ng.send(it)
	return nil
}

// Notify tells the local holder, if any, that its log grew (the holder's
// reader learns it from the stream anyway).
func (gr *Group) Notify() { gr.ng.g.notify(gr.ng.gh) }

// Stats returns the group's live figures from its holder; Members counts
// every member in the cluster. A group whose holder does not answer shows
// only its name.
func (gr *Group) Stats() keyshared.Stats {
	r, ok := gr.ng.remoteStats()
	if !ok {
		return keyshared.Stats{Group: gr.ng.name}
	}
	return r.Stats
}

// Members returns every member of the group in the cluster, with its node,
// sorted by id.
func (gr *Group) Members() []keyshared.MemberInfo {
	r, _ := gr.ng.remoteStats()
	slices.SortFunc(r.Members, func(a, b keyshared.MemberInfo) int { return strings.Compare(a.ID, b.ID) })
	return r.Members
}

// Holder returns the node holding the group's lease and whether one does.
func (gr *Group) Holder() (string, bool) {
	lv, _ := gr.ng.g.holderOf(gr.ng.gh)
	return lv.node, lv.node != ""
}

// HeldHere reports whether this node holds the group's lease now by its own
// clock (its dispatcher runs here and the lease cannot have lapsed), which
// a read of the lease, possibly stale, cannot tell.
func (gr *Group) HeldHere() bool {
	h := gr.ng.g.localHolder(gr.ng.gh)
	return h != nil && !h.stoppingNow() && h.lease.valid()
}

// States returns where messages stand, as the holder's dispatcher sees them.
func (gr *Group) States(ctx context.Context, offsets []uint64) ([]keyshared.MessageStatus, error) {
	return gr.ng.states(ctx, offsets)
}

// Route routes a QoS 0 message on the group's ring, at its holder: the
// member is known (and the outcome) only when the holder is this node.
func (gr *Group) Route(m *keyshared.Message) (string, bool) {
	ng := gr.ng
	if h := ng.g.localHolder(ng.gh); h != nil {
		return h.r.Route(m)
	}
	if _, ok := ng.g.holderOf(ng.gh); ok {
		_ = ng.g.node.nc.Publish(holderSubject(ng.gh), append([]byte{reqQoS0}, keyshared.EncodeMessage(m)...))
	}
	return "", true
}

// RouterStats returns the QoS 0 routing figures of a holder on this node.
func (gr *Group) RouterStats() keyshared.RouterStats {
	if h := gr.ng.g.localHolder(gr.ng.gh); h != nil {
		return h.r.Stats()
	}
	return keyshared.RouterStats{}
}

// Close ends this node's side of the group (the group lives on).
func (gr *Group) Close(context.Context) error {
	ng := gr.ng
	ng.g.mu.Lock()
	if ng.g.mu.nodes[ng.gh] == ng {
		delete(ng.g.mu.nodes, ng.gh)
	}
	ng.g.mu.Unlock()
	ng.close()
	return nil
}
