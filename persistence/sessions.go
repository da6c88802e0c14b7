package persistence

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// Kinds of session record. Each kind is a bucket under the top-level
// "sessions" bucket; keys and values are opaque to this package.
const (
	KindClient       = "clients"
	KindSubscription = "subscriptions"
	KindRetained     = "retained"
	KindInflight     = "inflight"
	KindSysInfo      = "sysinfo"
	// KindKeyFilters holds the key filters of persistent sessions' Key-Shared
	// memberships, keyed like subscriptions.
	KindKeyFilters = "keyfilters"
)

var sessionKinds = []string{KindClient, KindSubscription, KindRetained, KindInflight, KindSysInfo, KindKeyFilters}

var sessionsBucket = []byte("sessions")

// ErrUnknownKind is returned for a session record kind this package does not define.
var ErrUnknownKind = errors.New("persistence: unknown session record kind")

type opKind uint8

const (
	opPut opKind = iota
	opDelete
	opDeletePrefix
)

type syncResult struct {
	err   error
	batch uint64 // the commit the waiter was released by
}

type sessionOp struct {
	op   opKind
	kind string
	key  []byte
	val  []byte
}

// SessionStore keeps the broker's session state (clients, subscriptions,
// retained messages, inflight messages, sysinfo) as key/value records.
//
// Writes are queued in call order and committed by one goroutine, many per
// transaction. Put, Delete and DeletePrefix return at once; Sync waits until
// every write queued before it is committed, so a caller that needs a record
// durable before it answers a client calls Sync after its writes. Writes that
// nobody waits for reach the disk within one commit, a few milliseconds.
type SessionStore struct {
	db *DB

	mu struct {
		sync.Mutex
		pending []sessionOp       // queued writes, in call order
		waiters []chan syncResult // Sync callers waiting for pending to commit
		closed  bool
		// unreported is the error of a failed commit that no Sync waited on
		// (its writes were queued before any Sync call), and that commit's
		// number: a later Sync reports it.
		unreported      error
		unreportedBatch uint64
	}
	kick chan struct{} // wakes the committer; capacity 1
	done chan struct{} // closed when the committer has exited

	commits     atomic.Uint64
	writeErrors atomic.Uint64
}

// OpenSessions creates the session buckets if needed and starts the committer.
// Close it before closing the DB.
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
	s := &SessionStore{db: db, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go s.run()
	return s, nil
}

// Put queues a write of val under key in kind.
func (s *SessionStore) Put(kind string, key, val []byte) {
	s.enqueue(sessionOp{op: opPut, kind: kind, key: key, val: val})
}

// Delete queues the removal of key from kind.
func (s *SessionStore) Delete(kind string, key []byte) {
	s.enqueue(sessionOp{op: opDelete, kind: kind, key: key})
}

// DeletePrefix queues the removal of every key in kind that starts with prefix.
func (s *SessionStore) DeletePrefix(kind string, prefix []byte) {
	s.enqueue(sessionOp{op: opDeletePrefix, kind: kind, key: prefix})
}

func (s *SessionStore) enqueue(op sessionOp) {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		s.writeErrors.Add(1)
		s.db.log.Error("persistence: session write after close", "kind", op.kind)
		return
	}
	s.mu.pending = append(s.mu.pending, op)
	s.mu.Unlock()
	s.wake()
}

func (s *SessionStore) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Sync waits until every write queued before the call is committed and
// returns the commit's error, if any.
func (s *SessionStore) Sync() error {
	ch := make(chan syncResult, 1)
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.mu.waiters = append(s.mu.waiters, ch)
	s.mu.Unlock()
	s.wake()
	r := <-ch
	if r.err != nil {
		return r.err
	}
	// An earlier commit, which no Sync waited on, held writes queued before
	// this call: report its failure.
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.mu.unreported; err != nil && s.mu.unreportedBatch < r.batch {
		s.mu.unreported = nil
		return err
	}
	return nil
}

// Commits returns the number of transactions committed so far.
func (s *SessionStore) Commits() uint64 { return s.commits.Load() }

// WriteErrors returns the number of writes lost to a failed commit or made after Close.
func (s *SessionStore) WriteErrors() uint64 { return s.writeErrors.Load() }

// Close commits what is queued, stops the committer and returns the last commit's error.
func (s *SessionStore) Close() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	err := s.Sync()
	s.mu.Lock()
	s.mu.closed = true
	s.mu.Unlock()
	s.wake()
	<-s.done
	return err
}

func (s *SessionStore) run() {
	defer close(s.done)
	var batch uint64
	for range s.kick {
		batch++
		s.mu.Lock()
		ops, waiters, closed := s.mu.pending, s.mu.waiters, s.mu.closed
		s.mu.pending, s.mu.waiters = nil, nil
		s.mu.Unlock()
		var err error
		if len(ops) > 0 {
			err = s.commit(ops)
			if err != nil {
				s.writeErrors.Add(uint64(len(ops)))
				s.db.log.Error("persistence: session state commit failed", "writes", len(ops), "error", err)
			} else {
				s.commits.Add(1)
			}
		}
		if err != nil && len(waiters) == 0 {
			s.mu.Lock()
			s.mu.unreported, s.mu.unreportedBatch = err, batch
			s.mu.Unlock()
		}
		for _, w := range waiters {
			w <- syncResult{err, batch}
		}
		if closed {
			return
		}
	}
}

func (s *SessionStore) commit(ops []sessionOp) error {
	return s.db.bolt.Update(func(tx *bolt.Tx) error {
		root := tx.Bucket(sessionsBucket)
		for _, op := range ops {
			b := root.Bucket([]byte(op.kind))
			if b == nil {
				return fmt.Errorf("%w: %q", ErrUnknownKind, op.kind)
			}
			var err error
			switch op.op {
			case opPut:
				err = b.Put(op.key, op.val)
			case opDelete:
				err = b.Delete(op.key)
			case opDeletePrefix:
				err = deletePrefix(b, op.key)
			}
			if err != nil {
				return fmt.Errorf("%s %q: %w", op.kind, op.key, err)
			}
		}
		return nil
	})
}

func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
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
