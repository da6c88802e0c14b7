package cluster

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/keyline-mq/keyline/keyshared"

	"github.com/keyline-mq/keyline/internal/wire"
)

// nodeGroup is a group's side on one node: the members connected here,
// the deliveries they hold, their acks until the holder's state covers
// them, and the pipe that carries what they do to the holder. The broker's
// hook uses it as it uses a keyshared.Dispatcher on one node (see Group).
type nodeGroup struct {
	g     *Groups
	name  string
	gh    string
	local keyshared.Output // writes to the members' connections; publishes dead letters

	// applyMu orders down batches against a change of holder: a batch is
	// applied (and its deliveries become outstanding) either before the
	// resync that reports them, or refused as coming from an old holder.
	applyMu sync.Mutex

	mu struct {
		sync.Mutex
		members     map[string]*localMember
		outstanding map[delivery]string // delivery -> its key
		// unconfirmed: acks handed to a holder whose state may not cover
		// them yet (no = the state write number the holder answered).
		unconfirmed []pendingAck
		epoch       uint64
		holder      string // node id
		up          *pipe[upItem]
		downSeq     uint64 // last down batch applied in this epoch
		downReply   []byte // its answer, for a retry
		stats       *statsReply
		statsAt     time.Time
		closed      bool
		// queue holds what this node tells the holder about its members
		// (joins, leaves, activity, resyncs), in the order the member table
		// changed: each change appends its item under mu, and one goroutine
		// at a time (draining) sends the queue in order. A resync's snapshot
		// of the members is then never overtaken by a change it does not
		// contain, nor followed by one it already contains: a member that
		// joined as the holder changed was dropped by the holder as "left"
		// when the resync taken before its join arrived after it
		// (TestClusterSharedSubscriptionFollowsSession's CI failure).
		queue    []upItem
		draining bool
	}
}

type delivery struct {
	member string
	offset uint64
}

type pendingAck struct {
	member string
	offset uint64
	no     uint64 // 0: not answered yet
}

type localMember struct {
	opts   keyshared.MemberOptions
	qos    byte
	active bool
}

// Open implements keyshared.Backend: the node side of group name, whose
// deliveries to members on this node go through local. The group must exist
// (EnsureGroup). Its dispatcher runs on the node holding the group's lease,
// configured by GroupsConfig.Settings there (cfg is not used).
func (g *Groups) Open(name string, _ keyshared.Config, local keyshared.Output) (keyshared.Group, error) {
	gh := groupHash(name)
	g.mu.Lock()
	if g.mu.stopped {
		g.mu.Unlock()
		return nil, ErrNotReady
	}
	ng := g.mu.nodes[gh]
	if ng == nil {
		ng = &nodeGroup{g: g, name: name, gh: gh, local: local}
		ng.mu.members = map[string]*localMember{}
		ng.mu.outstanding = map[delivery]string{}
		g.mu.nodes[gh] = ng
	}
	lv, held := g.mu.leases[gh]
	g.mu.Unlock()
	if held {
		g.goFunc(func() { ng.holderChanged(lv.node, lv.epoch) })
	}
	return &Group{ng: ng}, nil
}

// canRead returns the read check of a member on this node (nil: none).
func (ng *nodeGroup) canRead(member string) func(string) bool {
	ng.mu.Lock()
	defer ng.mu.Unlock()
	if m := ng.mu.members[member]; m != nil {
		return m.opts.CanRead
	}
	return nil
}

// holderChanged points the node side at a new holder: the old pipe stops
// and the new holder gets a resync (members, deliveries held, acks it may
// not know).
func (ng *nodeGroup) holderChanged(node string, epoch uint64) { ng.switchHolder(node, epoch, false) }

// switchHolder is holderChanged; force resyncs with the holder of the
// current epoch again (a local holder that was not running yet when the
// lease was seen).
func (ng *nodeGroup) switchHolder(node string, epoch uint64, force bool) {
	ng.applyMu.Lock()
	defer ng.applyMu.Unlock()
	ng.mu.Lock()
	if ng.mu.closed || epoch < ng.mu.epoch || (epoch == ng.mu.epoch && !force) {
		ng.mu.Unlock()
		return
	}
	old := ng.mu.up
	ng.mu.epoch, ng.mu.holder, ng.mu.up = epoch, node, nil
	ng.mu.downSeq, ng.mu.downReply = 0, nil
	ng.mu.Unlock()
	if old != nil {
		for _, it := range old.close() {
			ng.unsent(it)
		}
	}
	ng.mu.Lock()
	items := ng.mu.queue
	items = append(items, upItem{kind: upResync})
	for id, m := range ng.mu.members {
		items = append(items, joinItem(id, m))
		if !m.active {
			items = append(items, upItem{kind: upActive, member: id})
		}
	}
	items = append(items, upItem{kind: upResync, member: resyncEnd})
	for d, key := range ng.mu.outstanding {
		items = append(items, upItem{kind: upOutstanding, member: d.member, offset: d.offset, key: key})
	}
	for _, a := range ng.mu.unconfirmed {
		items = append(items, upItem{kind: upAcked, member: a.member, offset: a.offset})
	}
	ng.mu.unconfirmed = nil // in the resync now; kept again once it is answered
	ng.mu.queue = items
	ng.mu.Unlock()
	if h := testHookResyncQueued.Load(); h != nil {
		(*h)(ng)
	}
	ng.flush()
}

// testHookResyncQueued, when set (tests), runs between queueing a resync and
// sending it: where a member change can race it.
var testHookResyncQueued atomic.Pointer[func(*nodeGroup)]

// postLocked queues items about the members (ng.mu held); flush sends them.
func (ng *nodeGroup) postLocked(items ...upItem) { ng.mu.queue = append(ng.mu.queue, items...) }

// flush sends the queued member items in order, unless another goroutine is
// sending them already (it sends these too, before it stops). It never
// waits for that goroutine, so a send that comes back into this node group
// (the local holder delivering to a member whose connection ends) cannot
// deadlock.
func (ng *nodeGroup) flush() {
	ng.mu.Lock()
	if ng.mu.draining {
		ng.mu.Unlock()
		return
	}
	ng.mu.draining = true
	for len(ng.mu.queue) > 0 {
		items := ng.mu.queue
		ng.mu.queue = nil
		ng.mu.Unlock()
		ng.send(items...)
		ng.mu.Lock()
	}
	ng.mu.draining = false
	ng.mu.Unlock()
}

// unsent takes back an item a closed pipe did not deliver: its ack is
// reported to the next holder.
func (ng *nodeGroup) unsent(it upItem) {
	if it.kind != upAck && it.kind != upAcked {
		return
	}
	ng.mu.Lock()
	ng.mu.unconfirmed = append(ng.mu.unconfirmed, pendingAck{member: it.member, offset: it.offset})
	ng.mu.Unlock()
}

func joinItem(id string, m *localMember) upItem {
	return upItem{kind: upJoin, member: id, qos: m.qos, recvMax: uint32(max(m.opts.ReceiveMaximum, 0)), filters: m.opts.KeyFilters, limit: m.opts.Limit}
}

// send hands items to the holder: directly when it is this node, through
// the pipe otherwise; with no holder known they are dropped (the next
// holder gets a resync).
func (ng *nodeGroup) send(items ...upItem) {
	ng.mu.Lock()
	epoch, holderNode := ng.mu.epoch, ng.mu.holder
	if holderNode == "" || ng.mu.closed {
		ng.mu.Unlock()
		for _, it := range items {
			ng.unsent(it)
		}
		return
	}
	if holderNode == ng.g.node.cfg.NodeID {
		ng.mu.Unlock()
		h := ng.g.localHolder(ng.gh)
		if h == nil || h.lease.epoch != epoch {
			for _, it := range items {
				ng.unsent(it)
			}
			return
		}
		no := h.applyUp(ng.g.node.cfg.NodeID, 0, items)
		ng.answered(items, no)
		return
	}
	p := ng.mu.up
	if p == nil {
		p = ng.newUpPipe(epoch)
		ng.mu.up = p
	}
	ng.mu.Unlock()
	if !p.push(items...) {
		for _, it := range items {
			ng.unsent(it)
		}
	}
}

func (ng *nodeGroup) newUpPipe(epoch uint64) *pipe[upItem] {
	id := ng.g.node.cfg.NodeID + "\x00" + nuid.Next()
	p := newPipe(func(seq uint64, items []upItem) ([]byte, error) {
		b := upBatch{epoch: epoch, node: id, seq: seq, items: items}
		data := append([]byte{reqUp}, b.encode()...)
		m, err := ng.g.node.nc.Request(holderSubject(ng.gh), data, ng.g.node.cfg.RequestTimeout)
		if err != nil {
			return nil, err
		}
		return m.Data, nil
	}, func(items []upItem, reply []byte) {
		if len(reply) == 0 {
			for _, it := range items {
				ng.unsent(it)
			}
			return
		}
		d := wire.NewDecoder(reply[1:], errWire)
		no := d.Uvarint()
		if reply[0] != replyOK {
			for _, it := range items {
				ng.unsent(it)
			}
			return // the holder changed: the watch brings the new one
		}
		ng.answered(items, no)
	})
	p.abandon = func() bool {
		ng.mu.Lock()
		defer ng.mu.Unlock()
		return ng.mu.epoch != epoch || ng.mu.closed
	}
	return p
}

// answered records the acks of a batch the holder applied: they are kept
// until its state write no is durable.
func (ng *nodeGroup) answered(items []upItem, no uint64) {
	ng.mu.Lock()
	defer ng.mu.Unlock()
	for _, it := range items {
		if it.kind == upAck || it.kind == upAcked {
			ng.mu.unconfirmed = append(ng.mu.unconfirmed, pendingAck{member: it.member, offset: it.offset, no: no})
		}
	}
}

// durable drops the acks the holder's state write no covers.
func (ng *nodeGroup) durable(epoch, no uint64) {
	ng.mu.Lock()
	defer ng.mu.Unlock()
	if epoch != ng.mu.epoch {
		return
	}
	kept := ng.mu.unconfirmed[:0]
	for _, a := range ng.mu.unconfirmed {
		if a.no == 0 || a.no > no {
			kept = append(kept, a)
		}
	}
	clear(ng.mu.unconfirmed[len(kept):])
	ng.mu.unconfirmed = kept
}

// kickRetry re-sends what may have been lost while this node was away from
// NATS: the pipe retries by itself; a missing holder is looked up again.
func (ng *nodeGroup) kickRetry() {
	if lv, ok := ng.g.holderOf(ng.gh); ok {
		ng.holderChanged(lv.node, lv.epoch)
	}
}

// deliverLocal writes a delivery to a member on this node and returns the
// outcome: deliveredOK, deliveryRefused (not active, or the write failed),
// or deliveryUnreadable (the member may not read its topic: not written,
// the holder routes it again, see ks_readaccess.go). The delivery is
// outstanding from before the write, so an ack cannot overtake it.
func (ng *nodeGroup) deliverLocal(member string, m *keyshared.Message, attempt int) byte {
	ng.mu.Lock()
	lm := ng.mu.members[member]
	if lm == nil || !lm.active {
		ng.mu.Unlock()
		return deliveryRefused
	}
	canRead := lm.opts.CanRead
	tracked := m.QoS > 0 && lm.qos > 0
	d := delivery{member, m.Offset}
	if tracked {
		ng.mu.outstanding[d] = m.Key
	}
	ng.mu.Unlock()
	outcome := deliveredOK
	switch {
	case canRead != nil && !canRead(m.Topic):
		outcome = deliveryUnreadable
	case !ng.local.Deliver(member, m, attempt):
		outcome = deliveryRefused
	}
	if f, flushes := ng.local.(keyshared.Flusher); flushes && outcome == deliveredOK {
		f.Flush() // no round here to wait for (keyshared.Output)
	}
	if outcome != deliveredOK && tracked {
		ng.mu.Lock()
		delete(ng.mu.outstanding, d)
		ng.mu.Unlock()
	}
	return outcome
}

func (ng *nodeGroup) revokeLocal(member string, offset uint64) {
	ng.mu.Lock()
	delete(ng.mu.outstanding, delivery{member, offset})
	ng.mu.Unlock()
	ng.local.Revoke(member, offset)
}

// onDown applies a down batch from a holder (kl.d.<this node>).
func (g *Groups) onDown(m *nats.Msg) {
	b, err := decodeDownBatch(m.Data)
	if err != nil {
		g.log.Warn("key-shared: malformed delivery batch", "error", err)
		return
	}
	ng := g.nodeGroupOf(b.group)
	if ng == nil {
		_ = m.Respond([]byte{replyOK}) // no member here: nothing to deliver to
		return
	}
	_ = m.Respond(ng.applyDown(&b))
}

func (ng *nodeGroup) applyDown(b *downBatch) []byte {
	ng.mu.Lock()
	newer := b.epoch > ng.mu.epoch
	ng.mu.Unlock()
	if newer {
		// A holder we have not heard of yet (epochs only grow): resync
		// with it first.
		ng.holderChanged(b.node, b.epoch)
	}
	ng.applyMu.Lock()
	defer ng.applyMu.Unlock()
	ng.mu.Lock()
	switch {
	case b.epoch != ng.mu.epoch:
		epoch := ng.mu.epoch
		ng.mu.Unlock()
		return binary.AppendUvarint([]byte{replyWrongEpoch}, epoch)
	case b.seq <= ng.mu.downSeq:
		reply := ng.mu.downReply
		ng.mu.Unlock()
		return reply
	}
	ng.mu.Unlock()
	reply := []byte{replyOK}
	var unreadable0 []int // QoS 0 items whose member may not read them
	for i := range b.items {
		it := &b.items[i]
		switch it.kind {
		case downDeliver, downQoS0:
			msg, err := keyshared.DecodeMessage(it.msg, true)
			if err != nil {
				if it.kind == downDeliver {
					reply = append(reply, deliveryRefused) // one outcome per delivery
				}
				continue
			}
			msg.Offset = it.offset
			if it.kind == downQoS0 {
				msg.QoS = 0
				if ng.deliverLocal(it.member, &msg, 1) == deliveryUnreadable {
					unreadable0 = append(unreadable0, i)
				}
				continue
			}
			reply = append(reply, ng.deliverLocal(it.member, &msg, int(it.attempt)))
		case downRevoke:
			ng.revokeLocal(it.member, it.offset)
		}
	}
	// After the outcomes of the deliveries: the QoS 0 items the holder
	// routes again (ks_readaccess.go).
	for _, i := range unreadable0 {
		reply = binary.AppendUvarint(reply, uint64(i))
	}
	ng.mu.Lock()
	ng.mu.downSeq, ng.mu.downReply = b.seq, reply
	ng.mu.Unlock()
	return reply
}

// onTakeover hears a holder's announcements (kl.t.<hash>): a new holder,
// or the state write that made acks durable.
func (g *Groups) onTakeover(m *nats.Msg) {
	var t takeoverMsg
	if json.Unmarshal(m.Data, &t) != nil || t.Node == g.node.cfg.NodeID {
		return
	}
	ng := g.nodeGroupOf(t.Group)
	if ng == nil {
		if t.Durable == 0 {
			g.goFunc(func() { g.emptyResync(t) })
		}
		return
	}
	if t.Durable > 0 {
		ng.durable(t.Epoch, t.Durable)
		return
	}
	ng.holderChanged(t.Node, t.Epoch)
}

// emptyResync tells a new holder that this node has no member of its group,
// so its takeover need not wait for us.
func (g *Groups) emptyResync(t takeoverMsg) {
	b := upBatch{epoch: t.Epoch, node: g.node.cfg.NodeID + "\x00" + nuid.Next(), seq: 1,
		items: []upItem{{kind: upResync}, {kind: upResync, member: resyncEnd}}}
	_, _ = g.node.nc.Request(holderSubject(t.Group), append([]byte{reqUp}, b.encode()...), g.node.cfg.RequestTimeout)
}

func (ng *nodeGroup) close() {
	ng.mu.Lock()
	ng.mu.closed = true
	p := ng.mu.up
	ng.mu.up = nil
	ng.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// statsReply is a holder's answer to a stats request.
type statsReply struct {
	Stats   keyshared.Stats        `json:"stats"`
	Members []keyshared.MemberInfo `json:"members"`
}

func (h *holder) statsReply() []byte {
	data, _ := json.Marshal(h.stats())
	return data
}

func (h *holder) stats() statsReply {
	r := statsReply{Stats: h.d.Stats()}
	h.mu.Lock()
	for id, m := range h.mu.members {
		r.Members = append(r.Members, keyshared.MemberInfo{ID: id, Node: m.node, QoS: m.qos, KeyFilters: m.filters, Connected: m.active})
	}
	h.mu.Unlock()
	return r
}

// remoteStats asks the holder for the group's live figures (cached briefly).
func (ng *nodeGroup) remoteStats() (statsReply, bool) {
	if h := ng.g.localHolder(ng.gh); h != nil {
		return h.stats(), true
	}
	ng.mu.Lock()
	if ng.mu.stats != nil && time.Since(ng.mu.statsAt) < 500*time.Millisecond {
		r := *ng.mu.stats
		ng.mu.Unlock()
		return r, true
	}
	ng.mu.Unlock()
	m, err := ng.g.node.nc.Request(holderSubject(ng.gh), []byte{reqStats}, time.Second)
	if err != nil {
		return statsReply{}, false
	}
	var r statsReply
	if json.Unmarshal(m.Data, &r) != nil {
		return statsReply{}, false
	}
	ng.mu.Lock()
	ng.mu.stats, ng.mu.statsAt = &r, time.Now()
	ng.mu.Unlock()
	return r, true
}

// states asks the holder where messages stand.
func (ng *nodeGroup) states(ctx context.Context, offs []uint64) ([]keyshared.MessageStatus, error) {
	if h := ng.g.localHolder(ng.gh); h != nil {
		return h.d.States(ctx, offs)
	}
	data, _ := json.Marshal(offs)
	m, err := ng.g.node.nc.RequestWithContext(ctx, holderSubject(ng.gh), append([]byte{reqStates}, data...))
	if err != nil {
		return nil, err
	}
	var out []keyshared.MessageStatus
	if err := json.Unmarshal(m.Data, &out); err != nil {
		return nil, err
	}
	if len(out) != len(offs) {
		return nil, errors.New("cluster: short answer")
	}
	return out, nil
}
