package hooks

import (
	"context"
	"errors"
	"slices"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
)

// What a cluster session has resolved: its in-flight deliveries tied to their KL_MSGS
// sequences, the floor below which everything is resolved, and the writes of its record.

// OnQosPublish ties a QoS 1/2 delivery to a persistent session to the
// KL_MSGS sequence of its message, so the session's floor never passes it
// while it is unacknowledged.
func (h *Cluster) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if pk.FixedHeader.Type != packets.Publish || h.node == nil {
		return
	}
	var seq uint64
	switch pk.Origin {
	case clusterQueuedClient:
		seq = h.injectSeq.Load()
	case clusterCoreClient, clusterSysClient:
		return
	default:
		v, ok := h.pubSeq.Load(pk.Origin)
		if !ok {
			return
		}
		seq = v.(uint64)
	}
	if seq == 0 {
		return
	}
	s := h.session(cl)
	if s == nil || !s.persistent.Load() {
		return
	}
	s.mu.Lock()
	s.inflight[pk.PacketID] = seq
	s.mu.Unlock()
}

// OnQosComplete records an acknowledgement.
func (h *Cluster) OnQosComplete(cl *mqtt.Client, pk packets.Packet) { h.resolved(cl, pk.PacketID) }

// OnQosDropped records a dropped delivery (it will not be retried either).
func (h *Cluster) OnQosDropped(cl *mqtt.Client, pk packets.Packet) { h.resolved(cl, pk.PacketID) }

func (h *Cluster) resolved(cl *mqtt.Client, id uint16) {
	if h.node == nil || cl.IsTakenOver() {
		return
	}
	s := h.session(cl)
	if s == nil {
		return
	}
	s.mu.Lock()
	if seq, ok := s.inflight[id]; ok {
		delete(s.inflight, id)
		s.acked = append(s.acked, seq)
		s.dirty = true
	}
	s.mu.Unlock()
}

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
	if inj := h.injectSeq.Load(); inj > 0 && inj-1 < covered {
		covered = inj - 1
	}
	for _, seq := range s.inflight {
		if seq-1 < covered {
			covered = seq - 1
		}
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

	nrev, err := h.node.SaveSession(ctx, &rec, rev)
	if errors.Is(err, cluster.ErrRevision) {
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
