package cluster

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/keyshared"
)

// Requests to a holder (kl.k.<hash>), by first byte.
const (
	reqUp     byte = 'u' // an up batch
	reqStats  byte = 's' // the group's live figures
	reqStates byte = 'm' // message states (admin)
	reqQoS0   byte = 'q' // a QoS 0 message to route (no answer)
)

// holder runs a group's dispatcher on the node holding its lease.
type holder struct {
	g     *Groups
	name  string
	gh    string
	lease *lease
	log   *groupLog
	adopt *adoptions
	d     *keyshared.Dispatcher
	r     *keyshared.Router
	sub   *nats.Subscription

	mu struct {
		sync.Mutex
		members  map[string]*heldMember // member id -> where it is
		links    map[string]*pipe[downItem]
		applied  map[string]uint64 // up pipe id -> last batch applied
		resynced map[string]bool   // nodes whose resync for this epoch is complete
		writeNo  uint64            // number of the next state write
		lastSeen time.Time         // when the group last had members
		stopping bool
	}
	resyncs  chan struct{} // a resync completed
	stopOnce sync.Once
	quit     chan struct{} // closed to end run
	done     chan struct{} // closed when run has ended
}

type heldMember struct {
	node    string
	qos     byte
	filters []string
	active  bool
	// refused is what the member's node answered it may not read (nil on
	// the holder's own node, whose members' CanRead the dispatcher asks).
	refused *refusedTopics
}

func (g *Groups) startHolder(name, gh string, l *lease) (*holder, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*g.node.cfg.RequestTimeout)
	defer cancel()
	st, err := g.loadState(ctx, gh)
	if err != nil {
		return nil, err
	}
	if err := g.resolveDeadLettered(ctx, gh, &st); err != nil {
		return nil, err
	}
	h := &holder{g: g, name: name, gh: gh, lease: l, adopt: newAdoptions(),
		resyncs: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	h.mu.members = map[string]*heldMember{}
	h.mu.links = map[string]*pipe[downItem]{}
	h.mu.applied = map[string]uint64{}
	h.mu.resynced = map[string]bool{}
	h.mu.writeNo = 1
	h.mu.lastSeen = st.lastSeen
	st.epoch = l.epoch
	h.log = newGroupLog(g, name, gh, l, st, h.adopt)
	dcfg, _ := g.cfg.Settings(name)
	dcfg.Group = name
	if dcfg.Logger == nil {
		dcfg.Logger = g.log
	}
	if h.d, err = keyshared.New(dcfg, h.log, holderOut{h}); err != nil {
		return nil, err
	}
	h.r = keyshared.NewRouter(routerOut{h})
	if h.sub, err = g.node.nc.Subscribe(holderSubject(gh), h.onRequest); err != nil {
		_ = h.d.Close(ctx)
		return nil, fmt.Errorf("cluster: subscribe: %w", err)
	}
	g.mu.Lock()
	g.mu.holders[gh] = h
	noLocal := g.mu.nodes[gh] == nil
	g.mu.Unlock()
	if noLocal {
		h.mu.Lock()
		h.mu.resynced[g.node.cfg.NodeID] = true // no member here
		h.mu.Unlock()
	}
	data, _ := json.Marshal(takeoverMsg{Group: gh, Epoch: l.epoch, Node: g.node.cfg.NodeID})
	_ = g.node.nc.Publish(subjTakeover+gh, data)
	if ng := g.nodeGroupOf(gh); ng != nil {
		ng.switchHolder(g.node.cfg.NodeID, l.epoch, true)
	}
	return h, nil
}

// loadState reads the group's replicated state; the stream's first
// sequence bounds the cursor from below (trimmed messages are resolved).
func (g *Groups) loadState(ctx context.Context, gh string) (groupState, error) {
	var st groupState
	e, err := g.kv.Get(ctx, g.stateKey(gh))
	switch {
	case err == nil:
		if st, err = decodeGroupState(e.Value()); err != nil {
			return st, fmt.Errorf("cluster: group state: %w", err)
		}
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
	default:
		return st, fmt.Errorf("cluster: group state: %w", err)
	}
	s, err := g.node.js.Stream(ctx, groupStream(gh))
	if err != nil {
		return st, fmt.Errorf("cluster: group log: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return st, fmt.Errorf("cluster: group log: %w", err)
	}
	if first := info.State.FirstSeq; first > st.cursor+1 {
		st.resolved.removeThrough(first - 1)
		st.cursor = first - 1
	}
	return st, nil
}

// resolveDeadLettered marks resolved the offsets of dead letters written
// after the state (the old holder may have died before writing it).
func (g *Groups) resolveDeadLettered(ctx context.Context, gh string, st *groupState) error {
	return g.eachDeadLetter(ctx, gh, st.dlqSeq+1, func(seq uint64, d keyshared.DeadLetter) bool {
		if off := d.Message.Offset; off > st.cursor {
			st.resolved.add(off, off)
			for len(st.resolved.r) > 0 && st.resolved.r[0][0] == st.cursor+1 {
				st.cursor = st.resolved.r[0][1]
				st.resolved.r = st.resolved.r[1:]
			}
		}
		st.dlqSeq = seq
		return true
	})
}

type takeoverMsg struct {
	Group string `json:"g"`
	Epoch uint64 `json:"e"`
	Node  string `json:"n"`
	// Durable, when set, says that the up batches each node had answered
	// with a write number up to Durable are in a state the server stored.
	Durable uint64 `json:"d,omitempty"`
}

// run waits for the nodes' resyncs, opens the log, and keeps the lease and
// the state until the lease is lost or the holder stops.
func (h *holder) run() {
	defer close(h.done)
	g := h.g
	deadline := time.NewTimer(g.cfg.GatherTimeout)
	for !h.allResynced() {
		select {
		case <-h.resyncs:
			continue
		case <-deadline.C:
		case <-h.quit:
		case <-g.closing:
		}
		break
	}
	deadline.Stop()
	h.log.start()
	h.log.open.Store(true)
	h.d.Notify()
	state := time.NewTicker(g.cfg.StateEvery)
	defer state.Stop()
	renew := time.NewTicker(g.cfg.RenewEvery)
	defer renew.Stop()
	lastTrim, trimmed := time.Now(), h.log.cursor()
	for {
		select {
		case <-h.quit:
			return
		case <-g.closing:
			return
		case <-renew.C:
			ctx, cancel := context.WithTimeout(context.Background(), g.node.cfg.RequestTimeout)
			err := h.lease.renew(ctx)
			cancel()
			if errors.Is(err, ErrLeaseLost) {
				g.log.Warn("key-shared: lease lost; this node stops dispatching the group", "group", h.name, "error", err)
				g.goFunc(func() { h.stopHolding(false) })
				return
			}
			if err != nil {
				g.log.Warn("key-shared: lease not renewed", "group", h.name, "error", err)
			}
		case <-state.C:
			h.writeState(false)
			if c := h.log.cursor(); c > trimmed && time.Since(lastTrim) > time.Second {
				h.trim(c)
				lastTrim, trimmed = time.Now(), c
				h.adopt.pruneThrough(c)
			}
			h.dropGoneNodes()
		}
	}
}

// writeState writes the log's state if it changed (or force), after the
// dispatcher applied every ack handed to it, then tells the nodes which of
// their batches it covers.
func (h *holder) writeState(force bool) {
	h.mu.Lock()
	no := h.mu.writeNo
	h.mu.writeNo++
	members, lastSeen := len(h.mu.members), h.mu.lastSeen
	if members > 0 {
		lastSeen = time.Now()
		h.mu.lastSeen = lastSeen
	}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), h.g.node.cfg.RequestTimeout)
	defer cancel()
	if err := h.d.Flush(ctx); err != nil && !errors.Is(err, keyshared.ErrClosed) {
		return
	}
	st, changed := h.log.snapshot(members, lastSeen)
	if !changed && !force {
		h.durable(no)
		return
	}
	if err := h.lease.writeState(ctx, st.encode()); err != nil {
		h.log.markDirty()
		if !errors.Is(err, ErrLeaseLost) {
			h.g.log.Warn("key-shared: group state not written", "group", h.name, "error", err)
		}
		return
	}
	h.durable(no)
}

// durable tells every node that its batches answered with write number
// <= no are in the stored state.
func (h *holder) durable(no uint64) {
	data, _ := json.Marshal(takeoverMsg{Group: h.gh, Epoch: h.lease.epoch, Node: h.g.node.cfg.NodeID, Durable: no})
	_ = h.g.node.nc.Publish(subjTakeover+h.gh, data)
	if ng := h.g.nodeGroupOf(h.gh); ng != nil {
		ng.durable(h.lease.epoch, no)
	}
}

// trim deletes the log's messages at or below the cursor.
func (h *holder) trim(cursor uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), h.g.node.cfg.RequestTimeout)
	defer cancel()
	s, err := h.g.node.js.Stream(ctx, groupStream(h.gh))
	if err == nil {
		err = s.Purge(ctx, jetstream.WithPurgeSequence(cursor+1))
	}
	if err != nil {
		h.g.log.Debug("key-shared: group log not trimmed", "group", h.name, "error", err)
	}
}

// stopHolding ends the holder. Graceful (handover, shutdown): deliveries
// stop, the dispatcher hands over its last resolutions, the state is
// written and the lease deleted, so the next holder starts at once.
func (h *holder) stopHolding(graceful bool) {
	h.stopOnce.Do(func() {
		h.mu.Lock()
		h.mu.stopping = true
		h.mu.Unlock()
		close(h.quit)
		<-h.done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.sub.Unsubscribe()
		_ = h.d.Close(ctx)
		h.log.close()
		if graceful && h.lease.valid() {
			h.writeState(true)
			if err := h.lease.release(ctx); err != nil {
				h.g.log.Debug("key-shared: lease not released", "group", h.name, "error", err)
			}
		} else {
			h.lease.lost.Store(true)
		}
		h.mu.Lock()
		links := h.mu.links
		h.mu.links = map[string]*pipe[downItem]{}
		h.mu.Unlock()
		for _, p := range links {
			p.close()
		}
		h.g.mu.Lock()
		if h.g.mu.holders[h.gh] == h {
			delete(h.g.mu.holders, h.gh)
		}
		h.g.mu.Unlock()
		h.g.kickPlacement()
	})
}

func (h *holder) stoppingNow() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.stopping
}

// allResynced reports whether every live node finished its resync.
func (h *holder) allResynced() bool {
	live := h.g.presence.live(time.Now())
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range live {
		if !h.mu.resynced[n] {
			return false
		}
	}
	return true
}

// dropGoneNodes removes the members of nodes that are gone: their in-flight
// messages go back to the head of their keys.
func (h *holder) dropGoneNodes() {
	now := time.Now()
	var gone, suspects []string
	var closing []*pipe[downItem]
	pr := h.g.presence
	h.mu.Lock()
	for id, m := range h.mu.members {
		switch {
		case pr.isLive(m.node, now):
		case pr.isGone(m.node):
			gone = append(gone, id)
			delete(h.mu.members, id)
		default:
			suspects = append(suspects, m.node)
		}
	}
	for node, p := range h.mu.links {
		if pr.isGone(node) {
			delete(h.mu.links, node)
			delete(h.mu.resynced, node)
			closing = append(closing, p)
		}
	}
	h.mu.Unlock()
	for _, p := range closing {
		h.g.goFunc(func() { p.close() })
	}
	for _, n := range suspects {
		h.g.suspect(n)
	}
	for _, id := range gone {
		h.g.log.Info("key-shared: member's node is gone; removing it", "group", h.name, "member", id)
		_ = h.d.RemoveMember(id)
		_ = h.r.RemoveMember(id)
	}
}

// onRequest serves kl.k.<hash>.
func (h *holder) onRequest(m *nats.Msg) {
	if len(m.Data) == 0 {
		return
	}
	switch m.Data[0] {
	case reqUp:
		b, err := decodeUpBatch(m.Data[1:])
		if err != nil {
			h.g.log.Warn("key-shared: malformed request", "group", h.name, "error", err)
			return
		}
		var reply []byte
		if b.epoch != h.lease.epoch || h.stoppingNow() {
			reply = binary.AppendUvarint([]byte{replyWrongEpoch}, h.lease.epoch)
		} else {
			reply = binary.AppendUvarint([]byte{replyOK}, h.applyUp(b.node, b.seq, b.items))
		}
		_ = m.Respond(reply)
	case reqStats:
		_ = m.Respond(h.statsReply())
	case reqStates:
		var offs []uint64
		if json.Unmarshal(m.Data[1:], &offs) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		sts, err := h.d.States(ctx, offs)
		cancel()
		if err != nil {
			return
		}
		data, _ := json.Marshal(sts)
		_ = m.Respond(data)
	case reqQoS0:
		msg, err := keyshared.DecodeMessage(m.Data[1:], true)
		if err == nil {
			h.r.Route(&msg)
		}
	}
}

// applyUp applies a batch from pipe (node id, a NUL, a nonce) numbered seq
// (0: direct call) and returns the number of the state write that will
// cover it.
func (h *holder) applyUp(pipeID string, seq uint64, items []upItem) uint64 {
	node, _, _ := strings.Cut(pipeID, "\x00")
	h.g.presence.touch(node)
	h.mu.Lock()
	if seq > 0 && seq <= h.mu.applied[pipeID] {
		no := h.mu.writeNo
		h.mu.Unlock()
		return no // a retry of a batch applied already
	}
	if seq > 0 {
		h.mu.applied[pipeID] = seq
	}
	h.mu.Unlock()
	var resyncing map[string]bool
	for i := range items {
		it := &items[i]
		switch it.kind {
		case upResync:
			if it.member == resyncEnd && resyncing != nil {
				h.finishResync(node, resyncing)
				resyncing = nil
			} else {
				resyncing = map[string]bool{}
			}
		case upJoin:
			if resyncing != nil {
				resyncing[it.member] = true
			}
			h.join(node, it)
		case upLeave:
			h.leave(node, it.member)
		case upActive:
			h.setActive(node, it.member, it.active)
		case upAck, upNack, upReject:
			if m, ok := h.adopt.answer(it.member, it.offset, it.kind == upAck); ok {
				h.answer(it.kind, m, it.offset, it.reason)
			}
		case upOutstanding:
			h.adopt.outstanding(it.member, it.offset, it.key)
		case upAcked:
			h.adopt.ackedEarly(it.member, it.offset)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.writeNo
}

// answer hands a member's ack (upAck), nack or reject to the dispatcher.
// One that meets a dispatcher already closed (the holder is stopping: its
// lease was lost or handed over) is dropped, counted and logged: the next
// holder learns of an ack from the node's resync (nodeGroup.unsent keeps
// it), and delivers a nacked or rejected message again.
func (h *holder) answer(kind byte, member string, offset uint64, reason byte) {
	var err error
	switch kind {
	case upAck:
		err = h.d.Ack(member, offset)
	case upNack:
		err = h.d.Nack(member, offset, reason)
	case upReject:
		err = h.d.Reject(member, offset, reason)
	}
	if err == nil {
		return
	}
	h.g.Stats.AnswersDropped.Add(1)
	h.g.log.Info("key-shared: a member's answer reached a stopped dispatcher; the next holder settles the message",
		"group", h.name, "member", member, "offset", offset, "answer", answerName(kind), "error", err)
}

func answerName(kind byte) string {
	switch kind {
	case upAck:
		return "ack"
	case upNack:
		return "nack"
	}
	return "reject"
}

// finishResync removes the members a node no longer has and records that
// the node's resync is complete.
func (h *holder) finishResync(node string, members map[string]bool) {
	var gone []string
	h.mu.Lock()
	for id, m := range h.mu.members {
		if m.node == node && !members[id] {
			gone = append(gone, id)
			delete(h.mu.members, id)
		}
	}
	h.mu.resynced[node] = true
	h.mu.Unlock()
	for _, id := range gone {
		_ = h.d.RemoveMember(id)
		_ = h.r.RemoveMember(id)
	}
	select {
	case h.resyncs <- struct{}{}:
	default:
	}
	h.d.Notify()
}
