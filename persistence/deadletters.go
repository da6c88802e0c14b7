package persistence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/keyline-mq/keyline/keyshared"
)

// Dead letters live in the data file under groups/<name>/dlq, keyed by an id
// that strictly increases within the group; the group's dlq-state (count and
// last id) changes in the same transaction as the letters.

// dlqOp runs change on g's bucket and dead-letter counters in the committer;
// the counters in memory follow once the transaction committed.
func (s *Groups) dlqOp(g *group, change func(bk *bolt.Bucket, st *dlqState) error) error {
	var after dlqState
	err := s.db.commit.do(func(tx *bolt.Tx) error {
		bk := tx.Bucket(groupsBucket).Bucket([]byte(g.name))
		if bk == nil {
			return groupNotFound(g.name)
		}
		st, err := decodeDLQState(bk.Get(dlqStateKey))
		if err != nil {
			return fatal(fmt.Errorf("%w: group %q: %w", ErrCorrupt, g.name, err))
		}
		if err := change(bk, &st); err != nil {
			return err
		}
		after = st
		return fatal(bk.Put(dlqStateKey, st.encode()))
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	g.dlq = after
	s.mu.Unlock()
	return nil
}

// view runs fn in a read transaction on the group's bucket.
func (s *Groups) view(name string, fn func(bk *bolt.Bucket) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	err := s.db.bolt.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(groupsBucket).Bucket([]byte(name))
		if bk == nil {
			return groupNotFound(name)
		}
		return fn(bk)
	})
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// DeadLetters implements GroupStore.
func (s *Groups) DeadLetters(name string, after uint64, limit int) ([]DeadLetterEntry, error) {
	var out []DeadLetterEntry
	err := s.view(name, func(bk *bolt.Bucket) error {
		c := bk.Bucket(dlqBucket).Cursor()
		for k, v := c.Seek(be64(after + 1)); k != nil && len(out) < limit && after != ^uint64(0); k, v = c.Next() {
			e, err := decodeDeadLetterEntry(name, k, v)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

func decodeDeadLetterEntry(group string, k, v []byte) (DeadLetterEntry, error) {
	id := binary.BigEndian.Uint64(k)
	d, _, err := keyshared.DecodeDeadLetter(v, true)
	if err != nil {
		return DeadLetterEntry{}, fmt.Errorf("%w: group %q dead letter %d: %w", ErrCorrupt, group, id, err)
	}
	d.Group = group
	return DeadLetterEntry{ID: id, DeadLetter: d}, nil
}

// DeadLetter implements GroupStore.
func (s *Groups) DeadLetter(name string, id uint64) (DeadLetterEntry, error) {
	var e DeadLetterEntry
	err := s.view(name, func(bk *bolt.Bucket) error {
		k := be64(id)
		v := bk.Bucket(dlqBucket).Get(k)
		if v == nil {
			return fmt.Errorf("%w: group %q id %d", ErrDeadLetterNotFound, name, id)
		}
		var err error
		e, err = decodeDeadLetterEntry(name, k, v)
		return err
	})
	return e, err
}

// DeleteDeadLetter implements GroupStore.
func (s *Groups) DeleteDeadLetter(name string, id uint64) error {
	g, err := s.lookup(name)
	if err != nil {
		return err
	}
	return s.dlqOp(g, func(bk *bolt.Bucket, st *dlqState) error {
		dlq, k := bk.Bucket(dlqBucket), be64(id)
		if dlq.Get(k) == nil {
			return fmt.Errorf("%w: group %q id %d", ErrDeadLetterNotFound, name, id)
		}
		if err := dlq.Delete(k); err != nil {
			return fatal(err)
		}
		st.count--
		return nil
	})
}

// ReplayDeadLetter implements GroupStore. The message is appended to the log
// first (durably), then the dead letter is deleted: a crash in between keeps
// both, so the message may come twice, never not at all.
func (s *Groups) ReplayDeadLetter(name string, id uint64) (uint64, error) {
	e, err := s.DeadLetter(name, id)
	if err != nil {
		return 0, err
	}
	m := e.Message
	m.Offset = 0
	off, err := s.Append(name, m)
	if err != nil {
		return 0, err
	}
	err = s.DeleteDeadLetter(name, id)
	if errors.Is(err, ErrDeadLetterNotFound) {
		err = nil // replayed or purged meanwhile: the message is on the log all the same
	}
	return off, err
}

// PurgeDeadLetters implements GroupStore.
func (s *Groups) PurgeDeadLetters(name string) (int, error) {
	g, err := s.lookup(name)
	if err != nil {
		return 0, err
	}
	var n int
	err = s.dlqOp(g, func(bk *bolt.Bucket, st *dlqState) error {
		n = int(st.count)
		if n == 0 {
			return nil
		}
		if err := bk.DeleteBucket(dlqBucket); err != nil {
			return fatal(err)
		}
		if _, err := bk.CreateBucket(dlqBucket); err != nil {
			return fatal(err)
		}
		st.count = 0
		return nil
	})
	return n, err
}

// quarantineBucket holds, per group, the raw records the codec could not
// decode, by offset.
var quarantineBucket = []byte("quarantine")

// maxQuarantined bounds the raw bytes kept of one bad record.
const maxQuarantined = 64 << 10

// quarantine keeps a record that cannot be decoded out of the way: raw in
// the data file (up to maxQuarantined bytes), counted in the group's figures
// and logged. The caller resolves its offset so the group goes on.
func (s *Groups) quarantine(g *group, off uint64, data []byte, why error) {
	s.lg.Error("persistence: quarantined a group log record that cannot be decoded", "group", g.name, "offset", off, "bytes", len(data), "error", why)
	raw := bytes.Clone(data[:min(len(data), maxQuarantined)])
	s.mu.Lock()
	g.quarantined++
	s.mu.Unlock()
	s.db.commit.queue(func(tx *bolt.Tx) error {
		bk := tx.Bucket(groupsBucket).Bucket([]byte(g.name))
		if bk == nil {
			return nil // deleted meanwhile
		}
		q, err := bk.CreateBucketIfNotExists(quarantineBucket)
		if err != nil {
			return fatal(err)
		}
		return fatal(q.Put(be64(off), raw))
	}, func(err error) {
		s.lg.Error("persistence: could not keep a quarantined record", "group", g.name, "offset", off, "error", err)
	})
}
