package persistence

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// Kinds of session record. Each kind is a bucket under the top-level
// "sessions" bucket; keys and values are opaque to this package.
//
// A session's client and subscriptions are its record in KindRecords
// (SessionRecords, a sessionstore.Store); before data format 3 they were
// mochi's JSON records in the buckets "clients" and "subscriptions",
// which opening such a file converts (migrateSessionRecords).
const (
	KindRetained = "retained"
	KindInflight = "inflight"
	KindSysInfo  = "sysinfo"
	// KindKeyFilters holds the key filters of persistent sessions' Key-Shared
	// memberships, keyed like subscriptions.
	KindKeyFilters = "keyfilters"
	// KindOutbox holds persistent sessions' queued and in-flight QoS 1/2
	// messages, keyed by client and sequence number (publish order), and a
	// record per session under sequence number 0.
	KindOutbox = "outbox"
)

var sessionKinds = []string{KindRecords, KindRetained, KindInflight, KindSysInfo, KindKeyFilters, KindOutbox}

var sessionsBucket = []byte("sessions")

// ErrUnknownKind is returned for a session record kind this package does not define.
var ErrUnknownKind = errors.New("persistence: unknown session record kind")

// SessionStore keeps the broker's session state (clients, subscriptions,
// retained messages, inflight messages, sysinfo) as key/value records in the
// data file, through its one committer.
//
// Put, Delete and DeletePrefix queue a write and return at once; it reaches
// the disk within one commit, a few milliseconds (write-behind: what nobody
// waits for). Write commits records and reports each one's outcome: use it
// for what a client is told is stored (a SUBACK, a PUBACK). Each write
// succeeds or fails on its own: a record bbolt cannot store (a key over 32
// KiB) fails alone, never the others of its transaction.
type SessionStore struct {
	db          *DB
	closed      atomic.Bool
	writeErrors atomic.Uint64
}

// SessionWrite is one record change for Write.
type SessionWrite struct {
	Kind string
	Key  []byte
	// Val is the record to put; nil with Delete set removes Key instead.
	Val    []byte
	Delete bool
}

// MaxSessionKey is the longest key a session record may have (bbolt's limit).
const MaxSessionKey = bolt.MaxKeySize

// OpenSessions creates the session buckets if needed.
func (db *DB) OpenSessions() (*SessionStore, error) {
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(sessionsBucket)
		if err != nil {
			return err
		}
		for _, k := range sessionKinds {
			if _, err := root.CreateBucketIfNotExists([]byte(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("persistence: create session buckets: %w", err)
	}
	return &SessionStore{db: db}, nil
}

// sessionBucket returns the bucket of kind.
func sessionBucket(tx *bolt.Tx, kind string) (*bolt.Bucket, error) {
	if b := tx.Bucket(sessionsBucket).Bucket([]byte(kind)); b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownKind, kind)
}

func (w SessionWrite) apply(tx *bolt.Tx) error {
	b, err := sessionBucket(tx, w.Kind)
	if err != nil {
		return err
	}
	if w.Delete {
		c := b.Cursor() // one look-up: found, it deletes where it stands
		if k, _ := c.Seek(w.Key); !bytes.Equal(k, w.Key) {
			return errUnchanged
		}
		return fatal(c.Delete())
	}
	if err := b.Put(w.Key, w.Val); err != nil {
		return fatal(fmt.Errorf("%s record of %d bytes under a key of %d bytes: %w", w.Kind, len(w.Val), len(w.Key), err))
	}
	return nil
}

func (s *SessionStore) queue(apply func(tx *bolt.Tx) error, kind string) {
	ok := !s.closed.Load() && s.db.commit.queue(apply, func(err error) {
		s.writeErrors.Add(1)
		s.db.log.Error("persistence: session write failed", "kind", kind, "error", err)
	})
	if !ok {
		s.writeErrors.Add(1)
		s.db.log.Error("persistence: session write after close", "kind", kind)
	}
}

// Put queues a write of val under key in kind.
func (s *SessionStore) Put(kind string, key, val []byte) {
	s.queue(SessionWrite{Kind: kind, Key: key, Val: val}.apply, kind)
}

// PutNotify queues a write of val under key in kind, like Put, and calls
// done with its outcome once it is committed (nil) or failed: the caller
// can hold back what it tells a client until then without waiting. done
// runs on the committer's goroutine and must be short.
func (s *SessionStore) PutNotify(kind string, key, val []byte, done func(error)) {
	w := SessionWrite{Kind: kind, Key: key, Val: val}
	o := &txOp{apply: w.apply, after: func(err error) {
		if err != nil {
			s.writeErrors.Add(1)
			s.db.log.Error("persistence: session write failed", "kind", kind, "error", err)
		}
		done(err)
	}}
	if s.closed.Load() || !s.db.commit.submit(o) {
		s.writeErrors.Add(1)
		done(ErrClosed)
	}
}

// Delete queues the removal of key from kind.
func (s *SessionStore) Delete(kind string, key []byte) {
	s.queue(SessionWrite{Kind: kind, Key: key, Delete: true}.apply, kind)
}

// DeletePrefix queues the removal of every key in kind that starts with prefix.
func (s *SessionStore) DeletePrefix(kind string, prefix []byte) {
	s.queue(func(tx *bolt.Tx) error {
		b, err := sessionBucket(tx, kind)
		if err != nil {
			return err
		}
		return fatal(deletePrefix(b, prefix))
	}, kind)
}

// Write commits ws and returns one error per write (nil: it is durable).
// Writes queued before it are committed first.
func (s *SessionStore) Write(ws ...SessionWrite) []error {
	errs := make([]error, len(ws))
	ops := make([]*txOp, len(ws))
	for i, w := range ws {
		ops[i] = &txOp{apply: w.apply, done: make(chan struct{})}
		if s.closed.Load() || !s.db.commit.submit(ops[i]) {
			ops[i] = nil
			errs[i] = ErrClosed
		}
	}
	for i, o := range ops {
		if o == nil {
			continue
		}
		<-o.done
		if errs[i] = o.err; o.err != nil {
			s.writeErrors.Add(1)
		}
	}
	return errs
}

// Sync waits until every write queued before the call is committed (or
// failed: write-behind failures are counted in WriteErrors and logged).
func (s *SessionStore) Sync() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.db.commit.sync()
}

// Commits returns the number of transactions the data file's committer made.
func (s *SessionStore) Commits() uint64 { return s.db.commit.commits.Load() }

// WriteErrors returns the number of writes lost to a failed commit or made after Close.
func (s *SessionStore) WriteErrors() uint64 { return s.writeErrors.Load() }

// Close commits what is queued; writes after it fail (and are counted).
func (s *SessionStore) Close() error {
	if s.closed.Load() {
		return nil
	}
	err := s.Sync()
	s.closed.Store(true)
	if errors.Is(err, ErrClosed) {
		return nil
	}
	return err
}

func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	c := b.Cursor()
	deleted := false
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
		deleted = true
	}
	if !deleted {
		return errUnchanged
	}
	return nil
}

// Get returns a copy of the committed record of kind under key, or nil.
func (s *SessionStore) Get(kind string, key []byte) ([]byte, error) {
	var out []byte
	err := s.db.bolt.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(sessionsBucket).Bucket([]byte(kind))
		if b == nil {
			return fmt.Errorf("%w: %q", ErrUnknownKind, kind)
		}
		if v := b.Get(key); v != nil {
			out = bytes.Clone(v)
		}
		return nil
	})
	return out, err
}

// ForEachPrefix calls fn for every record of kind whose key starts with
// prefix, in key order, reading committed state only. The slices passed to
// fn are valid only during the call.
func (s *SessionStore) ForEachPrefix(kind string, prefix []byte, fn func(key, val []byte) error) error {
	return s.db.bolt.View(func(tx *bolt.Tx) error {
		b, err := sessionBucket(tx, kind)
		if err != nil {
			return err
		}
		c := b.Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if err := fn(k, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// ForEach calls fn for every record of kind in key order, reading committed
// state only. The slices passed to fn are valid only during the call.
func (s *SessionStore) ForEach(kind string, fn func(key, val []byte) error) error {
	return s.db.bolt.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(sessionsBucket).Bucket([]byte(kind))
		if b == nil {
			return fmt.Errorf("%w: %q", ErrUnknownKind, kind)
		}
		return b.ForEach(fn)
	})
}
