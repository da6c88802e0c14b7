package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/keyline-mq/keyline/keyshared"

	"github.com/keyline-mq/keyline/internal/wire"
)

// A holder's members: joins, leaves and activity from every node, the pipes down to
// their nodes, and the deliverers the dispatcher writes through.

// join takes a member's join from node. A member id is a client id, the
// same on every node, and each node reports its own members in its own
// pipe: when the client's session moves between nodes, the old node's
// report of it (a resync made before it let the client go, say) can
// arrive after the new node's join. A join from another node than the one
// the member is held through therefore replaces it only if node owns the
// client's session now (its record says so; the record cannot be read:
// the later join wins).
func (h *holder) join(node string, it *upItem) {
	h.mu.Lock()
	prev := h.mu.members[it.member]
	h.mu.Unlock()
	if prev != nil && prev.node != node && h.ownedBy(it.member, prev.node) {
		h.g.log.Debug("key-shared: a node's report of a member whose session moved to another node; ignored", "group", h.name, "member", it.member, "from", node, "held through", prev.node)
		return
	}
	hm := &heldMember{node: node, qos: it.qos, filters: it.filters, active: true}
	opts := keyshared.MemberOptions{ReceiveMaximum: int(it.recvMax), KeyFilters: it.filters, Limit: it.limit}
	if h.g.cfg.Fits != nil {
		// The exact check of one node, from what the member's node reported.
		opts.Fits = h.g.cfg.Fits(it.limit, it.qos)
	}
	if node == h.g.node.cfg.NodeID {
		if ng := h.g.nodeGroupOf(h.gh); ng != nil {
			opts.CanRead = ng.canRead(it.member)
		}
	} else {
		hm.refused = &refusedTopics{} // its node answers (ks_readaccess.go)
		opts.CanRead = hm.refused.canRead
	}
	h.mu.Lock()
	h.mu.members[it.member] = hm
	h.mu.lastSeen = time.Now()
	h.mu.Unlock()
	if prev != nil && prev.node != node {
		// The client moved to another node: what it held there is gone.
		_ = h.d.RemoveMember(it.member)
		_ = h.r.RemoveMember(it.member)
	}
	if err := h.d.AddMember(it.member, opts); err != nil {
		h.g.log.Warn("key-shared: add member", "group", h.name, "member", it.member, "error", err)
	}
	_ = h.r.AddMember(it.member, opts)
}

// ownedBy reports whether the session record of client names node as its
// owner (false when it cannot be read).
func (h *holder) ownedBy(client, node string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), h.g.node.cfg.RequestTimeout)
	defer cancel()
	rec, _, err := h.g.node.SessionStore().Load(ctx, client)
	return err == nil && rec != nil && rec.Owner == node
}

// leave and setActive apply news from node only while the member is held
// through node: once the client's session moved to another node, news of
// its membership there (a leave, a disconnect) would end the new one
// (member ids are client ids, the same on every node).
func (h *holder) leave(node, member string) {
	h.mu.Lock()
	if m := h.mu.members[member]; m != nil && m.node != node {
		h.mu.Unlock()
		return // moved to another node since
	}
	delete(h.mu.members, member)
	h.mu.Unlock()
	if err := h.d.RemoveMember(member); err != nil && !errors.Is(err, keyshared.ErrUnknownMember) {
		h.g.log.Warn("key-shared: remove member", "group", h.name, "member", member, "error", err)
	}
	_ = h.r.RemoveMember(member)
}

func (h *holder) setActive(node, member string, active bool) {
	h.mu.Lock()
	m := h.mu.members[member]
	if m != nil && m.node != node {
		h.mu.Unlock()
		return // moved to another node since
	}
	if m != nil {
		m.active = active
	}
	h.mu.Unlock()
	if err := h.d.SetActive(member, active); errors.Is(err, keyshared.ErrUnknownMember) {
		h.mu.Lock()
		delete(h.mu.members, member) // evicted meanwhile
		h.mu.Unlock()
	}
	if !active {
		_ = h.r.RemoveMember(member)
	}
}

// memberNode returns the node of a member ("" if unknown).
func (h *holder) memberNode(member string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.mu.members[member]; m != nil {
		return m.node
	}
	return ""
}

// link returns the down pipe to node, making it when needed.
func (h *holder) link(node string) *pipe[downItem] {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.stopping {
		return nil
	}
	p := h.mu.links[node]
	if p == nil {
		p = newPipe(func(seq uint64, items []downItem) ([]byte, error) {
			b := downBatch{group: h.gh, node: h.g.node.cfg.NodeID, epoch: h.lease.epoch, seq: seq, items: items}
			m, err := h.g.node.nc.Request(subjDeliver+NodeHash(node), b.encode(), h.g.node.cfg.RequestTimeout)
			if err != nil {
				return nil, err
			}
			return m.Data, nil
		}, func(items []downItem, reply []byte) { h.delivered(items, reply) })
		p.abandon = func() bool { return h.g.presence.isGone(node) || h.stoppingNow() }
		h.mu.links[node] = p
	}
	return p
}

// delivered applies a node's answer to a down batch: a delivery the member
// could not take goes back to its key (counted as a failed attempt); one it
// may not read goes back uncounted, to another member (ks_readaccess.go).
func (h *holder) delivered(items []downItem, reply []byte) {
	if len(reply) == 0 {
		return
	}
	if reply[0] == replyWrongEpoch {
		if d := wire.NewDecoder(reply[1:], errWire); d.Uvarint() > h.lease.epoch {
			h.g.log.Warn("key-shared: a node knows a newer holder; this one stops", "group", h.name)
			h.lease.lost.Store(true)
		}
		return
	}
	outcomes := reply[1:]
	k := 0
	for j, it := range items {
		if it.kind != downDeliver {
			continue
		}
		if k < len(outcomes) {
			switch outcomes[k] {
			case deliveryRefused:
				h.answer(upNack, it.member, it.offset, 0)
			case deliveryUnreadable:
				h.unreadable(it.member, &items[j])
			}
		}
		k++
	}
	if k < len(outcomes) {
		h.unreadableQoS0(items, outcomes[k:])
	}
}

// holderOut delivers the group's messages: to members on this node
// directly, to others through their node.
type holderOut struct{ h *holder }

func (o holderOut) Deliver(member string, m *keyshared.Message, attempt int) bool {
	h := o.h
	if !h.lease.valid() || h.stoppingNow() {
		return false
	}
	if adopted, ack := h.adopt.intercept(member, m.Offset); adopted {
		if ack {
			h.answer(upAck, member, m.Offset, 0)
		}
		return true
	}
	node := h.memberNode(member)
	switch node {
	case "":
		return false
	case h.g.node.cfg.NodeID:
		ng := h.g.nodeGroupOf(h.gh)
		if ng == nil {
			return false
		}
		switch ng.deliverLocal(member, m, attempt) {
		case deliveryRefused:
			return false
		case deliveryUnreadable:
			// Its CanRead, which the dispatcher asked, refuses it by now
			// (an ACL reload): taken, then handed back.
			h.giveBack(member, m.Offset)
		}
		return true
	}
	p := h.link(node)
	return p != nil && p.push(downItem{kind: downDeliver, member: member, offset: m.Offset, attempt: uint32(attempt), msg: keyshared.EncodeMessage(m)})
}

func (o holderOut) Revoke(member string, offset uint64) {
	h := o.h
	h.adopt.revoked(offset)
	switch node := h.memberNode(member); node {
	case "":
	case h.g.node.cfg.NodeID:
		if ng := h.g.nodeGroupOf(h.gh); ng != nil {
			ng.revokeLocal(member, offset)
		}
	default:
		if p := h.link(node); p != nil {
			p.push(downItem{kind: downRevoke, member: member, offset: offset})
		}
	}
}

// routerOut delivers QoS 0 messages routed on the group's ring.
type routerOut struct{ h *holder }

func (o routerOut) Deliver(member string, m *keyshared.Message, _ int) bool {
	h := o.h
	switch node := h.memberNode(member); node {
	case "":
		return false
	case h.g.node.cfg.NodeID:
		ng := h.g.nodeGroupOf(h.gh)
		return ng != nil && ng.deliverLocal(member, m, 0) != deliveryRefused
	default:
		p := h.link(node)
		return p != nil && p.push(downItem{kind: downQoS0, member: member, offset: m.Offset, msg: keyshared.EncodeMessage(m)})
	}
}

func (routerOut) Revoke(string, uint64) {}
