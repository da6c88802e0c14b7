package hooks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// sweepInterval is how often a node looks for sessions left behind by nodes
// that are gone.
const sweepInterval = time.Minute

// orphanSweep deletes the records of sessions whose owner is gone and
// that nobody will expire: a persistent session past its expiry interval
// (counted from its disconnect, or from when this node first found its
// owner gone), and a clean session at once. Sessions a live node holds are
// its to expire. It owns what it remembers of orphans between sweeps, and
// needs of the cluster only the records and whether a node answers.
type orphanSweep struct {
	records sessionstore.Store
	self    string                                               // this node's id
	alive   func(ctx context.Context, node string) (bool, error) // whether a node answers
	// maxExpiry is the broker's max-session-expiry, in seconds.
	maxExpiry uint32

	// wills takes the records of gone owners that still hold a will
	// (willWatch.note); the sweep leaves them until the will is out.
	wills func(rec *sessionstore.Record, rev uint64, st *sessionstate.State, now time.Time)

	mu      sync.Mutex
	orphans map[string]time.Time // client id -> when its owner was first found gone
}

// run sweeps once at now and returns the client ids deleted.
func (o *orphanSweep) run(ctx context.Context, now time.Time) ([]string, error) {
	alive := map[string]bool{}
	var deleted []string
	var firstErr error
	seen := map[string]bool{}
	err := o.records.ForEach(ctx, func(rec *sessionstore.Record, rev uint64) bool {
		if rec.Owner == o.self {
			return true
		}
		up, known := alive[rec.Owner]
		if !known {
			var err error
			if up, err = o.alive(ctx, rec.Owner); err != nil {
				firstErr = err
				return ctx.Err() == nil
			}
			alive[rec.Owner] = up
		}
		if up {
			return true
		}
		seen[rec.ClientID] = true
		st, stOK := recordState(rec)
		if stOK && willIn(st) != nil {
			if o.wills != nil {
				o.wills(rec, rev, st, now)
			}
			return true // its will is published first, then it goes
		}
		o.mu.Lock()
		since, ok := o.orphans[rec.ClientID]
		if !ok {
			since = now
			o.orphans[rec.ClientID] = now
		}
		o.mu.Unlock()
		if rec.Persistent {
			base := since
			if !rec.Connected && rec.DisconnectedAt > 0 {
				base = time.Unix(rec.DisconnectedAt, 0)
			}
			expiry, ok := sessionExpiry(st, stOK, o.maxExpiry)
			if !ok || now.Before(base.Add(expiry)) {
				return true
			}
		}
		if err := o.records.Delete(ctx, rec.ClientID, rev); err != nil && !errors.Is(err, sessionstore.ErrRevision) && firstErr == nil {
			firstErr = err
		} else if err == nil {
			deleted = append(deleted, rec.ClientID)
			o.mu.Lock()
			delete(o.orphans, rec.ClientID)
			o.mu.Unlock()
		}
		return true
	})
	// Only a walk over every record tells what is gone: one cut short
	// (a read that failed) forgets no orphan, which would restart its
	// expiry. Records that cannot be decoded are not orphans of anyone.
	if err == nil || errors.Is(err, sessionrec.ErrCorrupt) {
		o.mu.Lock()
		for id := range o.orphans {
			if !seen[id] {
				delete(o.orphans, id) // taken over or deleted meanwhile
			}
		}
		o.mu.Unlock()
	}
	if err != nil {
		return deleted, err
	}
	return deleted, firstErr
}

// recordState decodes a record's State (sessionstate.DecodeCluster: also
// the JSON of older releases); false: unreadable, and st is empty.
func recordState(rec *sessionstore.Record) (st *sessionstate.State, ok bool) {
	st, err := sessionstate.DecodeCluster(rec.ClientID, rec.State)
	if err != nil {
		return &sessionstate.State{}, false
	}
	return st, true
}

// sessionExpiry is how long a persistent session with state st (ok: it
// could be read) outlives its connection, as its owner would have applied
// it with max-session-expiry maxExpiry (seconds); false: never.
func sessionExpiry(st *sessionstate.State, ok bool, maxExpiry uint32) (time.Duration, bool) {
	if !ok {
		return 0, false
	}
	expiry := maxExpiry
	if st.Client.ProtocolVersion == 5 && st.Client.Properties.SessionExpiryIntervalFlag {
		expiry = min(expiry, st.Client.Properties.SessionExpiryInterval)
	}
	if expiry == ^uint32(0) {
		return 0, false // 3.1.1 without max-session-expiry, or a v5 client asking for ever
	}
	return time.Duration(expiry) * time.Second, true
}

// loop sweeps every sweepInterval until stop.
func (o *orphanSweep) loop(stop <-chan struct{}, log func() *slog.Logger) {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), sweepInterval/2)
			deleted, err := o.run(ctx, now)
			cancel()
			if err != nil {
				log().Warn("cluster: sweeping sessions of nodes that are gone", "error", err)
			}
			for _, id := range deleted {
				log().Info("cluster: expired a session left by a node that is gone", "client", id)
			}
		}
	}
}
