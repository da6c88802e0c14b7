package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/keyline-mq/keyline/cluster"
)

// sweepInterval is how often a node looks for sessions left behind by nodes
// that are gone.
const sweepInterval = time.Minute

// SweepOrphans deletes the records of sessions whose owner is gone and that
// nobody will expire: a persistent session past its expiry interval
// (counted from its disconnect, or from when this node first found its owner
// gone), and a clean session at once. Sessions a live node holds are its to
// expire. It returns the client ids deleted.
func (h *Cluster) SweepOrphans(ctx context.Context, now time.Time) ([]string, error) {
	self := h.node.NodeID()
	alive := map[string]bool{}
	var deleted []string
	var firstErr error
	seen := map[string]bool{}
	err := h.node.ForEachSession(ctx, func(rec *cluster.SessionRecord, rev uint64) bool {
		if rec.Owner == self {
			return true
		}
		up, known := alive[rec.Owner]
		if !known {
			var err error
			if up, err = h.node.Alive(ctx, rec.Owner); err != nil {
				firstErr = err
				return ctx.Err() == nil
			}
			alive[rec.Owner] = up
		}
		if up {
			return true
		}
		seen[rec.ClientID] = true
		h.mu.Lock()
		since, ok := h.mu.orphans[rec.ClientID]
		if !ok {
			since = now
			h.mu.orphans[rec.ClientID] = now
		}
		h.mu.Unlock()
		if rec.Persistent {
			base := since
			if !rec.Connected && rec.DisconnectedAt > 0 {
				base = time.Unix(rec.DisconnectedAt, 0)
			}
			expiry, ok := h.recordExpiry(rec)
			if !ok || now.Before(base.Add(expiry)) {
				return true
			}
		}
		if err := h.node.DeleteSession(ctx, rec.ClientID, rev); err != nil && !errors.Is(err, cluster.ErrRevision) && firstErr == nil {
			firstErr = err
		} else if err == nil {
			deleted = append(deleted, rec.ClientID)
		}
		return true
	})
	h.mu.Lock()
	for id := range h.mu.orphans {
		if !seen[id] {
			delete(h.mu.orphans, id) // taken over or deleted meanwhile
		}
	}
	h.mu.Unlock()
	if err != nil {
		return deleted, err
	}
	return deleted, firstErr
}

// recordExpiry is how long a persistent session outlives its connection,
// as its owner would have applied it; false: never.
func (h *Cluster) recordExpiry(rec *cluster.SessionRecord) (time.Duration, bool) {
	var st clusterState
	if json.Unmarshal(rec.State, &st) != nil {
		return 0, false
	}
	expiry := h.server.Options.Capabilities.MaximumSessionExpiryInterval
	if st.Client.ProtocolVersion == 5 && st.Client.Properties.SessionExpiryIntervalFlag {
		expiry = min(expiry, st.Client.Properties.SessionExpiryInterval)
	}
	if expiry == ^uint32(0) {
		return 0, false // 3.1.1 without max-session-expiry, or a v5 client asking for ever
	}
	return time.Duration(expiry) * time.Second, true
}

// sweepLoop runs SweepOrphans every sweepInterval until Stop.
func (h *Cluster) sweepLoop() {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), sweepInterval/2)
			deleted, err := h.SweepOrphans(ctx, now)
			cancel()
			if err != nil {
				h.Log.Warn("cluster: sweeping sessions of nodes that are gone", "error", err)
			}
			for _, id := range deleted {
				h.Log.Info("cluster: expired a session left by a node that is gone", "client", id)
			}
		}
	}
}
