package hooks

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/sessionstore"
)

// What a cluster session has resolved: its in-flight deliveries tied to their KL_MSGS
// sequences, the floor below which everything is resolved, and the writes of its record.

// OutboxStore returns the outbox.Store of cluster mode: the session copy
// this node holds tracks the KL_MSGS sequences of its outbox's messages and
// which were acknowledged; its record (floor and acknowledged sequences) is
// written from them (flush). The messages themselves stay in KL_MSGS: a
// node that takes the session over replays them from there.
func (h *Cluster) OutboxStore() outbox.Store { return clusterOutboxes{h.table} }

// clusterOutboxes reports the outbox's messages to the session copies of
// the table; it owns nothing.
type clusterOutboxes struct{ table *sessionTable }

func (o clusterOutboxes) Put(client string, m outbox.Stored) {
	if m.Ref == 0 {
		return
	}
	if s := o.table.get(client); s != nil {
		s.mu.Lock()
		s.live[m.Seq] = m.Ref
		s.mu.Unlock()
	}
}

func (o clusterOutboxes) Delete(client string, seq, ref uint64) {
	if ref == 0 {
		return
	}
	if s := o.table.get(client); s != nil {
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
	if s := o.table.get(client); s != nil {
		s.mu.Lock()
		clear(s.live)
		s.mu.Unlock()
	}
}

func (clusterOutboxes) PutMeta(string, []byte) {}

// DeleteSession: the session's record goes with its copy (forget), not here.
func (clusterOutboxes) DeleteSession(string) {}

// floorSource is what a session's floor depends on outside the session
// (the forwarder).
type floorSource interface {
	// readTo is the highest KL_MSGS sequence the node has read.
	readTo() uint64
	// bound lowers covered below every sequence being stored or
	// delivered here.
	bound(covered uint64) uint64
}

// recordWriter writes the records of the session copies the table holds:
// their floor (below which everything is resolved), acknowledged
// sequences and state. It owns no lock of its own: what it writes is the
// session's, under the session's lock.
type recordWriter struct {
	records sessionstore.Store // set by Cluster.SetNode
	table   *sessionTable
	floors  floorSource
	// stale is told of a copy whose record write was refused (another node
	// owns the session) once the table no longer holds it.
	stale func(s *clusterSession)
	stats *ClusterStats
	log   func() *slog.Logger
}

// floorLocked is the highest sequence at or below which every message for
// the session has been resolved: nothing in flight, nothing being delivered.
func (w *recordWriter) floorLocked(s *clusterSession) uint64 {
	covered := w.floors.bound(max(w.floors.readTo(), s.replayedTo.Load(), s.rec.Floor))
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
func (w *recordWriter) flush(ctx context.Context, s *clusterSession, force bool) {
	if !s.released.Load() {
		w.write(ctx, s, force)
	}
}

// write writes a copy's record if it changed (or force), installed or
// not: a copy being released writes its last progress this way.
func (w *recordWriter) write(ctx context.Context, s *clusterSession, force bool) {
	s.mu.Lock()
	if !s.persistent.Load() {
		s.mu.Unlock()
		return
	}
	floor := w.floorLocked(s)
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

	nrev, err := w.records.Save(ctx, &rec, rev)
	if errors.Is(err, sessionstore.ErrRevision) {
		if w.table.removeStale(s) {
			w.log().Info("cluster: session taken over by another node", "client", s.id)
			w.stale(s)
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.dirty = true
		w.stats.RecordErrors.Add(1)
		w.log().Warn("cluster: session record not written; retrying", "client", s.id, "error", err)
		return
	}
	if s.rev == rev {
		s.rev, s.rec, s.acked = nrev, rec, acked
	}
}

// flushLoop writes changed session records every 200 ms, and all of them
// once more when the hook stops.
func (w *recordWriter) loop(stop <-chan struct{}) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		stopping := false
		select {
		case <-stop:
			stopping = true
		case <-t.C:
		}
		w.flushAll()
		if stopping {
			return
		}
	}
}

// flushAll writes the records of every installed copy that changed.
func (w *recordWriter) flushAll() {
	for _, s := range w.table.all() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		w.flush(ctx, s, false)
		cancel()
	}
}

// willSent drops the will from the record of cl's session: mochi sent it.
// A delayed will is sent from the client mochi keeps for the session,
// which need not be the connection's: the installed copy counts unless a
// live connection holds it.
func (w *recordWriter) willSent(cl *mqtt.Client) {
	s := w.table.get(cl.ID)
	if s == nil || (s.client != cl && !s.client.Closed()) {
		return
	}
	s.mu.Lock()
	if s.will != nil {
		s.will, s.dirty = nil, true // the next flush writes it
	}
	s.mu.Unlock()
}
