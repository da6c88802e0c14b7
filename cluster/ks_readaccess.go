package cluster

import (
	"sync"

	"github.com/keyline-mq/keyline/internal/wire"
	"github.com/keyline-mq/keyline/keyshared"
)

// Read access of members on other nodes than the holder's.
//
// On one node the dispatcher asks each member's CanRead (the broker's ACL)
// before it offers a message, so a message goes only to a member that may
// read its topic: another eligible member gets it, or its key waits. The
// holder cannot ask another node's ACL synchronously per message, and
// shipping the rules would not be exact (a client's own token ACL, rules by
// address, reloads). So the member's node decides, as it does anyway before
// it writes a delivery to the client: a delivery its member may not read is
// not written but answered deliveryUnreadable. The holder then records the
// topic as one that member may not read, which its CanRead refuses from then
// on, and hands the message back to the dispatcher (Dispatcher.Return): not
// an attempt, not a nack, it goes to another eligible member or waits, as on
// one node. A QoS 0 message (the Router's: no state, no outcome per
// delivery) a member may not read is listed after the outcomes of the
// node's answer; the holder records its topic likewise and routes it again.
// A join (a resubscribe, a resync with a new holder, a reload of the ACL on
// the member's node) starts the member's record afresh.

// maxRefusedTopics bounds the topics recorded per member; past it an old
// one is forgotten (and found out again by the next delivery on it).
const maxRefusedTopics = 4096

// refusedTopics is what a remote member's node answered it may not read.
type refusedTopics struct {
	mu     sync.Mutex
	topics map[string]struct{}
}

// canRead is the member's CanRead at the holder.
func (r *refusedTopics) canRead(topic string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, refused := r.topics[topic]
	return !refused
}

func (r *refusedTopics) refuse(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topics == nil {
		r.topics = map[string]struct{}{}
	}
	if len(r.topics) >= maxRefusedTopics {
		for t := range r.topics {
			delete(r.topics, t)
			break
		}
	}
	r.topics[topic] = struct{}{}
}

// unreadable takes a delivery to member back from its node, which answered
// that the member may not read it.
func (h *holder) unreadable(member string, it *downItem) {
	h.mu.Lock()
	m := h.mu.members[member]
	h.mu.Unlock()
	if m == nil || m.refused == nil {
		return // gone since: its deliveries went back with it
	}
	msg, err := keyshared.DecodeMessage(it.msg, false)
	if err != nil {
		return
	}
	m.refused.refuse(msg.Topic)
	h.giveBack(member, it.offset)
}

// unreadableQoS0 routes again the QoS 0 items of a down batch whose members
// may not read them: rest lists their indexes in items (the tail of the
// node's answer). As on one node, another eligible member gets each, or
// none does (the Router skips it).
func (h *holder) unreadableQoS0(items []downItem, rest []byte) {
	d := wire.NewDecoder(rest, errWire)
	for len(d.Rest()) > 0 {
		i := d.Uvarint()
		if d.Err() != nil || i >= uint64(len(items)) || items[i].kind != downQoS0 {
			return
		}
		it := &items[i]
		h.mu.Lock()
		m := h.mu.members[it.member]
		h.mu.Unlock()
		msg, err := keyshared.DecodeMessage(it.msg, false)
		if err != nil {
			continue
		}
		if m != nil && m.refused != nil {
			m.refused.refuse(msg.Topic)
		}
		msg.Offset, msg.QoS = it.offset, 0
		h.r.Route(&msg)
	}
}

// giveBack hands a delivery member may not read back to the dispatcher.
func (h *holder) giveBack(member string, offset uint64) {
	if err := h.d.Return(member, offset); err != nil {
		h.g.Stats.AnswersDropped.Add(1)
	}
}

// ReadAccessChanged tells the holders of the groups with members on this
// node that their read access may have changed (the ACL was reloaded): each
// connected member joins again, as a resubscribe does, so its holder forgets
// what it was refused and asks its node afresh (a disconnected one joins
// again when it reconnects). A member's node applies the rules in force to
// every delivery anyway; this is for what a reload now allows.
func (g *Groups) ReadAccessChanged() {
	for _, ng := range g.nodeGroups() {
		ng.mu.Lock()
		for id, m := range ng.mu.members {
			if m.active { // an inactive one joins again when it reconnects
				ng.postLocked(joinItem(id, m))
			}
		}
		ng.mu.Unlock()
		ng.flush()
	}
}
