package persistence

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/keyline-mq/keyline/internal/wire"
	"github.com/keyline-mq/keyline/sessionstore"
)

// KindRecords holds one node's session records (sessionstore.Record), by
// client id, since data format 3; each value starts with its revision.
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

// recordVersion is the first byte of an encoded record.
const recordVersion = 1

// record flags
const (
	rPersistent = 1 << iota
	rConnected
)

// encodeRecord encodes rec at revision rev: the version, the revision, the
// flags, then owner, floor, acked, disconnected-at and the state, the
// strings and slices with a uvarint length. The client id is the key.
func encodeRecord(rec *sessionstore.Record, rev uint64) []byte {
	b := make([]byte, 0, 24+len(rec.Owner)+5*len(rec.Acked)+len(rec.State))
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, rev)
	var flags byte
	if rec.Persistent {
		flags |= rPersistent
	}
	if rec.Connected {
		flags |= rConnected
	}
	b = append(b, flags)
	b = wire.AppendString(b, rec.Owner)
	b = binary.AppendUvarint(b, rec.Floor)
	b = binary.AppendUvarint(b, uint64(len(rec.Acked)))
	for _, a := range rec.Acked {
		b = binary.AppendUvarint(b, a)
	}
	b = binary.AppendVarint(b, rec.DisconnectedAt)
	return append(b, rec.State...)
}

var errBadRecord = errors.New("persistence: session record cannot be decoded")

// recordRevision returns the revision an encoded record carries (0: none).
func recordRevision(v []byte) uint64 {
	if len(v) < 2 || v[0] != recordVersion {
		return 0
	}
	rev, n := binary.Uvarint(v[1:])
	if n <= 0 {
		return 0
	}
	return rev
}

// decodeRecord decodes the record of client id; the result shares no memory with v.
func decodeRecord(id string, v []byte) (*sessionstore.Record, uint64, error) {
	d := wire.NewDecoder(v, fmt.Errorf("%w: %q", errBadRecord, id))
	if d.Byte() != recordVersion {
		d.Fail("version")
	}
	rev := d.Uvarint()
	flags := d.Byte()
	rec := &sessionstore.Record{ClientID: id, Persistent: flags&rPersistent != 0, Connected: flags&rConnected != 0}
	rec.Owner = d.String()
	rec.Floor = d.Uvarint()
	if n := d.Count(); n > 0 {
		rec.Acked = make([]uint64, n)
		for i := range rec.Acked {
			rec.Acked[i] = d.Uvarint()
		}
	}
	rec.DisconnectedAt = d.Varint()
	if rest := d.Rest(); len(rest) > 0 {
		rec.State = bytes.Clone(rest)
	}
	if err := d.Err(); err != nil {
		return nil, 0, err
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

// Load returns the client's committed record and its revision.
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
		rec, rev, err = decodeRecord(clientID, v)
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
		if recordRevision(b.Get(key)) != rev {
			return sessionstore.ErrRevision
		}
		seq, err := b.NextSequence()
		if err != nil {
			return fatal(err)
		}
		if err := b.Put(key, encodeRecord(rec, seq)); err != nil {
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
		if rev == 0 || recordRevision(b.Get(key)) != rev {
			return sessionstore.ErrRevision
		}
		return fatal(b.Delete(key))
	})
}

// forEachBatch is how many records ForEach decodes per read transaction:
// fn runs outside them (it may write, which a long read would hold up).
const forEachBatch = 1024

// ForEach calls fn with every committed record, in client id order, until
// fn returns false. A record that cannot be decoded is an error, after fn
// had every record before it.
func (r *SessionRecords) ForEach(ctx context.Context, fn func(rec *sessionstore.Record, rev uint64) bool) error {
	type entry struct {
		rec *sessionstore.Record
		rev uint64
	}
	var after []byte // last key handed out
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch := make([]entry, 0, forEachBatch)
		var bad error
		err := r.s.db.bolt.View(func(tx *bolt.Tx) error {
			c := recordsBucket(tx).Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for ; k != nil && len(batch) < forEachBatch; k, v = c.Next() {
				rec, rev, err := decodeRecord(string(k), v)
				if err != nil {
					bad = err
					return nil
				}
				batch = append(batch, entry{rec, rev})
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range batch {
			if !fn(e.rec, e.rev) {
				return nil
			}
		}
		if bad != nil {
			return bad
		}
		if len(batch) < forEachBatch {
			return nil
		}
		after = []byte(batch[len(batch)-1].rec.ClientID)
	}
}
