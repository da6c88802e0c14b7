package persistence

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/sessionstore"
)

// KindRecords holds one node's session records (sessionstore.Record), by
// client id, since data format 3; each value is sessionrec's form without
// the id (sessionrec.Encode), which starts with its revision.
const KindRecords = "records"

// SessionRecords is the data file's sessionstore.Store: one node's session
// records in sessions/records, written through the file's committer. A
// Save or Delete returns once its commit is on disk (fsync), and its
// revision check runs inside that transaction, against what is committed
// and queued before it, so of racing writers exactly one wins. Revisions
// come from the bucket's sequence, which only grows and is stored with it.
type SessionRecords struct{ s *SessionStore }

var _ sessionstore.Store = (*SessionRecords)(nil)

// Records returns the session records of the store's data file.
func (s *SessionStore) Records() *SessionRecords { return &SessionRecords{s} }

// decodeRecord decodes the record stored under client id (sessionrec's
// form without the id); its error names the id.
func decodeRecord(id string, v []byte) (*sessionstore.Record, uint64, error) {
	rec, rev, err := sessionrec.Decode(id, v)
	if err == nil && rec.ClientID != id {
		err = fmt.Errorf("%w: it names client %q", sessionrec.ErrCorrupt, rec.ClientID)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("persistence: session record of %q: %w", id, err)
	}
	return rec, rev, nil
}

func recordsBucket(tx *bolt.Tx) *bolt.Bucket {
	return tx.Bucket(sessionsBucket).Bucket([]byte(KindRecords))
}

// commit runs apply in the committer's next transaction and returns its
// outcome once that is committed.
func (r *SessionRecords) commit(ctx context.Context, apply func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := &txOp{apply: apply, done: make(chan struct{})}
	if r.s.closed.Load() || !r.s.db.commit.submit(o) {
		return ErrClosed
	}
	<-o.done // a commit takes milliseconds; it cannot be called back once queued
	if o.err != nil && !errors.Is(o.err, sessionstore.ErrRevision) {
		r.s.writeErrors.Add(1)
	}
	return o.err
}

// Load returns the client's committed record and its revision. A record
// that cannot be decoded is an error wrapping sessionrec.ErrCorrupt, with
// the revision a Save that replaces it passes.
func (r *SessionRecords) Load(ctx context.Context, clientID string) (*sessionstore.Record, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var rec *sessionstore.Record
	var rev uint64
	err := r.s.db.bolt.View(func(tx *bolt.Tx) error {
		v := recordsBucket(tx).Get([]byte(clientID))
		if v == nil {
			return nil
		}
		var err error
		if rec, rev, err = decodeRecord(clientID, v); err != nil {
			rev = sessionrec.Revision(v) // what a Save that replaces it passes
		}
		return err
	})
	return rec, rev, err
}

// Save writes rec if its record is still at rev and returns the new
// revision once it is durable.
func (r *SessionRecords) Save(ctx context.Context, rec *sessionstore.Record, rev uint64) (uint64, error) {
	key := []byte(rec.ClientID)
	var nrev uint64
	err := r.commit(ctx, func(tx *bolt.Tx) error {
		b := recordsBucket(tx)
		if sessionrec.Revision(b.Get(key)) != rev {
			return sessionstore.ErrRevision
		}
		seq, err := b.NextSequence()
		if err != nil {
			return fatal(err)
		}
		if err := b.Put(key, sessionrec.Encode(rec, seq)); err != nil {
			return fatal(fmt.Errorf("session record of %d bytes under a client id of %d bytes: %w", len(rec.State), len(key), err))
		}
		nrev = seq
		return nil
	})
	return nrev, err
}

// Delete deletes the client's record if it is still at rev, once durable.
func (r *SessionRecords) Delete(ctx context.Context, clientID string, rev uint64) error {
	key := []byte(clientID)
	return r.commit(ctx, func(tx *bolt.Tx) error {
		b := recordsBucket(tx)
		if rev == 0 || sessionrec.Revision(b.Get(key)) != rev {
			return sessionstore.ErrRevision
		}
		return fatal(b.Delete(key))
	})
}

// forEachBatch is how many records ForEach decodes per read transaction:
// fn runs outside them (it may write, which a long read would hold up).
const forEachBatch = 1024

// ForEach calls fn with every committed record, in client id order, until
// fn returns false. A record that cannot be decoded is skipped: fn has
// every other, and ForEach then returns an error that names the first
// such client id (wrapping sessionrec.ErrCorrupt).
func (r *SessionRecords) ForEach(ctx context.Context, fn func(rec *sessionstore.Record, rev uint64) bool) error {
	type entry struct {
		rec *sessionstore.Record
		rev uint64
	}
	var bad sessionrec.Unreadable
	var after []byte // last key read
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch := make([]entry, 0, forEachBatch)
		end := false
		err := r.s.db.bolt.View(func(tx *bolt.Tx) error {
			c := recordsBucket(tx).Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			var last []byte // valid in this transaction only
			for ; k != nil && len(batch) < forEachBatch; k, v = c.Next() {
				last = k
				rec, rev, err := decodeRecord(string(k), v)
				if err != nil {
					bad.Add(err)
					continue
				}
				batch = append(batch, entry{rec, rev})
			}
			end = k == nil
			if last != nil {
				after = bytes.Clone(last)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range batch {
			if !fn(e.rec, e.rev) {
				return bad.Err()
			}
		}
		if end {
			return bad.Err()
		}
	}
}
