package hooks

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/sessionstore"
)

// What a cluster session has resolved: its in-flight deliveries tied to their KL_MSGS
// sequences, the floor below which everything is resolved, and the writes of its record.

// MessageRef is the fan-out's Refs in cluster mode: the KL_MSGS sequence of
// a QoS 1/2 publish, kept with every outbox copy of it so that the
// session's floor stays below it until it is acknowledged. A message from
// another node is the one being injected; a local publish was stored by
// OnPublish before it is delivered here. Retained messages and QoS 0 have
// none (0).
func (h *Cluster) MessageRef(pk packets.Packet) uint64 {
	switch pk.Origin {
	case clusterQueuedClient:
		return h.injectSeq.Load()
	case clusterCoreClient, clusterSysClient:
		return 0
	}
	if v, ok := h.pubSeq.Load(pk.Origin); ok {
		return v.(uint64)
	}
	return 0
}

// OutboxStore returns the outbox.Store of cluster mode: the session copy
// this node holds tracks the KL_MSGS sequences of its outbox's messages and
// which were acknowledged; its record (floor and acknowledged sequences) is
// written from them (flush). The messages themselves stay in KL_MSGS: a
// node that takes the session over replays them from there.
func (h *Cluster) OutboxStore() outbox.Store { return clusterOutboxes{h} }

type clusterOutboxes struct{ h *Cluster }

func (o clusterOutboxes) Put(client string, m outbox.Stored) {
	if m.Ref == 0 {
		return
	}
	if s := o.h.table.get(client); s != nil {
		s.mu.Lock()
		s.live[m.Seq] = m.Ref
		s.mu.Unlock()
	}
}

func (o clusterOutboxes) Delete(client string, seq, ref uint64) {
	if ref == 0 {
		return
	}
	if s := o.h.table.get(client); s != nil {
		s.mu.Lock()
		if _, ok := s.live[seq]; ok {
			delete(s.live, seq)
			s.acked = append(s.acked, ref)
			s.dirty = true
		}
		s.mu.Unlock()
	}
}

// Renumber (outbox.Renumberer): the outbox Puts its messages again under
// new sequences.
func (o clusterOutboxes) Renumber(client string) {
	if s := o.h.table.get(client); s != nil {
		s.mu.Lock()
		clear(s.live)
		s.mu.Unlock()
	}
}

func (clusterOutboxes) PutMeta(string, []byte) {}

// DeleteSession: the session's record goes with its copy (forget), not here.
func (clusterOutboxes) DeleteSession(string) {}

// floorLocked is the highest sequence at or below which every message for
// the session has been resolved: nothing in flight, nothing being delivered.
func (h *Cluster) floorLocked(s *clusterSession) uint64 {
	covered := max(h.node.QueuedPosition(), s.replayedTo.Load(), s.rec.Floor)
	h.pubSeq.Range(func(_, v any) bool {
		if seq := v.(uint64); seq > 0 && seq-1 < covered {
			covered = seq - 1
		}
		return true
	})
	h.storing.Range(func(_, v any) bool {
		if seq := v.(uint64); seq-1 < covered {
			covered = seq - 1
		}
		return true
	})
	if inj := h.injectSeq.Load(); inj > 0 && inj-1 < covered {
		covered = inj - 1
	}
	for _, seq := range s.live {
		if seq-1 < covered {
			covered = seq - 1
		}
	}
	if s.capped {
		covered = min(covered, s.floorCap)
	}
	return max(s.rec.Floor, covered)
}

// flush writes the record of an installed copy if it changed (or force).
// A refused write means another node owns the session: this node drops it.
func (h *Cluster) flush(ctx context.Context, s *clusterSession, force bool) {
	if !s.released.Load() {
		h.write(ctx, s, force)
	}
}

// write writes a copy's record if it changed (or force), installed or
// not: a copy being released writes its last progress this way.
func (h *Cluster) write(ctx context.Context, s *clusterSession, force bool) {
	s.mu.Lock()
	if !s.persistent.Load() {
		s.mu.Unlock()
		return
	}
	floor := h.floorLocked(s)
	if !force && !s.dirty && floor < s.rec.Floor+10000 {
		s.mu.Unlock()
		return
	}
	rec := s.rec
	rec.Floor = floor
	acked := s.acked[:0:0]
	for _, a := range s.acked {
		if a > floor {
			acked = append(acked, a)
		}
	}
	slices.Sort(acked)
	if len(acked) > maxAcked {
		acked = acked[len(acked)-maxAcked:]
	}
	rec.Acked = acked
	rec.State = s.stateLocked()
	rev := s.rev
	s.dirty = false
	s.mu.Unlock()

	nrev, err := h.records.Save(ctx, &rec, rev)
	if errors.Is(err, sessionstore.ErrRevision) {
		if h.table.removeStale(s) {
			h.Log.Info("cluster: session taken over by another node", "client", s.id)
			h.dropCopy(s)
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.dirty = true
		h.Stats.RecordErrors.Add(1)
		h.Log.Warn("cluster: session record not written; retrying", "client", s.id, "error", err)
		return
	}
	if s.rev == rev {
		s.rev, s.rec, s.acked = nrev, rec, acked
	}
}

// flushLoop writes changed session records every 200 ms, and all of them
// once more when the hook stops.
func (h *Cluster) flushLoop() {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		stopping := false
		select {
		case <-h.stop:
			stopping = true
		case <-t.C:
		}
		for _, s := range h.table.all() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			h.flush(ctx, s, false)
			cancel()
		}
		if stopping {
			return
		}
	}
}
