package persistence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Groups is the bbolt GroupStore, on the DB's file under the top-level bucket
// "groups". Obtain it with DB.Groups; DB.Close stops it.
type Groups struct {
	db  *DB
	log *slog.Logger
	q   *queue

	mu struct {
		sync.RWMutex
		// groups holds the committed state of every group. Only the committer
		// changes it, and only after the transaction that wrote the change committed.
		groups map[string]*group
	}

	// Owned by the committer goroutine.
	trimQueue map[string]struct{} // groups whose log still holds entries at or below the cursor
	notices   []*op               // completed ops whose callbacks wait for the notifier
	heads     []groupHead         // groups that got entries in the last commit

	onAppend atomic.Pointer[func(group string, head uint64)]
	notify   *notifier
	wg       sync.WaitGroup
	closed   atomic.Bool

	commits, commitErrors, committedOps atomic.Uint64
}

// CommitStats are the committer's counters since Open.
type CommitStats struct {
	// Commits counts transactions that committed; Ops the operations they held
	// (an append to several groups counts once).
	Commits, Ops uint64
	// Errors counts transactions that failed to commit (their operations failed).
	Errors uint64
}

// Stats returns the committer's counters.
func (s *Groups) Stats() CommitStats {
	return CommitStats{Commits: s.commits.Load(), Ops: s.committedOps.Load(), Errors: s.commitErrors.Load()}
}

// group is one group's committed meta and state, guarded by Groups.mu.
type group struct {
	meta groupMeta
	st   groupState
}

var _ GroupStore = (*Groups)(nil)

// openGroups loads every group's meta and state and starts the committer.
func openGroups(db *DB) (g *Groups, err error) {
	s := &Groups{db: db, log: db.log.With("store", "groups"), q: newQueue(), trimQueue: make(map[string]struct{})}
	s.mu.groups = make(map[string]*group)
	defer func() {
		// bbolt panics on some damaged pages; report them as corruption.
		if r := recover(); r != nil {
			g, err = nil, fmt.Errorf("%w: %s: reading groups: %v", ErrCorrupt, db.path, r)
		}
	}()
	now := time.Now()
	err = db.bolt.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(groupsBucket)
		if err != nil {
			return fmt.Errorf("persistence: create groups bucket: %w", err)
		}
		return root.ForEach(func(k, v []byte) error {
			name := string(k)
			if v != nil {
				return fmt.Errorf("%w: %s: groups/%q is a value, not a group bucket", ErrCorrupt, db.path, name)
			}
			gr, err := loadGroup(root.Bucket(k), name, now)
			if err != nil {
				return fmt.Errorf("%w: %s: group %q: %w", ErrCorrupt, db.path, name, err)
			}
			s.mu.groups[name] = gr
			if gr.st.trimmable() {
				s.trimQueue[name] = struct{}{}
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	s.notify = newNotifier()
	s.wg.Add(1)
	go s.run()
	return s, nil
}

// loadGroup reads one group and checks its state against its log.
func loadGroup(bk *bolt.Bucket, name string, now time.Time) (*group, error) {
	if _, _, err := splitGroupName(name); err != nil {
		return nil, err
	}
	mv, sv := bk.Get(metaKey), bk.Get(stateKey)
	lb, db := bk.Bucket(logBucket), bk.Bucket(dlqBucket)
	if mv == nil || sv == nil || lb == nil || db == nil {
		return nil, errors.New("missing meta, state, log or dlq")
	}
	meta, err := decodeMeta(mv)
	if err != nil {
		return nil, err
	}
	st, err := decodeState(sv)
	if err != nil {
		return nil, err
	}
	c := lb.Cursor()
	first, _ := c.First()
	last, _ := c.Last()
	switch {
	case st.msgs == 0 && first != nil:
		return nil, fmt.Errorf("state says the log is empty but it holds offset %d", binary.BigEndian.Uint64(first))
	case st.msgs > 0 && (first == nil || !bytes.Equal(first, be64(st.first)) || !bytes.Equal(last, be64(st.head))):
		return nil, fmt.Errorf("state says the log holds offsets %d..%d, it does not", st.first, st.head)
	}
	if st.active {
		// The broker stopped while the group had members: the idle TTL starts now.
		st.lastSeen, st.active = timeNanos(now), false
	}
	return &group{meta: meta, st: st}, nil
}

// Groups returns the bbolt group store of db.
func (db *DB) Groups() *Groups { return db.groups }

// close stops the committer after it committed everything submitted, then the notifier.
func (s *Groups) close() {
	if s.closed.Swap(true) {
		return
	}
	s.q.close()
	s.wg.Wait()
	s.notify.close()
}

// submit queues o; when the store is closed it completes o with ErrClosed at once.
func (s *Groups) submit(o *op) {
	if err := s.q.push(o); err != nil {
		o.err = err
		for i := range o.res {
			o.res[i].Err = err
		}
		if o.complete != nil {
			o.complete(o)
		} else {
			close(o.done)
		}
	}
}

// do runs apply in the committer and waits for its commit.
func (s *Groups) do(apply func(b *batch) error) error {
	o := &op{apply: apply, done: make(chan struct{})}
	s.submit(o)
	<-o.done
	return o.err
}

func newAppendOp(groups []string, m *keyshared.Message) *op {
	o := &op{enc: encodeMessage(m)}
	if len(groups) == 1 {
		o.one[0] = groups[0]
		o.groups = o.one[:]
	} else {
		o.groups = groups
	}
	o.res = make([]AppendResult, len(groups))
	for i, g := range o.groups {
		o.res[i].Group = g
	}
	o.size = uint64(len(o.enc))
	return o
}

// Append implements GroupStore.
func (s *Groups) Append(group string, m keyshared.Message) (uint64, error) {
	o := newAppendOp([]string{group}, &m)
	o.done = make(chan struct{})
	s.submit(o)
	<-o.done
	return o.res[0].Offset, o.res[0].Err
}

// AppendAsync implements GroupStore.
func (s *Groups) AppendAsync(group string, m keyshared.Message, done func(offset uint64, err error)) {
	o := newAppendOp([]string{group}, &m)
	o.complete = func(o *op) { done(o.res[0].Offset, o.res[0].Err) }
	s.submit(o)
}

// AppendMulti implements GroupStore.
func (s *Groups) AppendMulti(groups []string, m keyshared.Message) []AppendResult {
	o := newAppendOp(slices.Clone(groups), &m)
	o.done = make(chan struct{})
	s.submit(o)
	<-o.done
	return o.res
}

// AppendMultiAsync implements GroupStore.
func (s *Groups) AppendMultiAsync(groups []string, m keyshared.Message, done func([]AppendResult)) {
	o := newAppendOp(slices.Clone(groups), &m)
	o.complete = func(o *op) { done(o.res) }
	s.submit(o)
}

// OnAppend implements GroupStore.
func (s *Groups) OnAppend(fn func(group string, head uint64)) { s.onAppend.Store(&fn) }

// EnsureGroup implements GroupStore.
func (s *Groups) EnsureGroup(name string, cfg GroupConfig) (bool, error) {
	share, filter, err := splitGroupName(name)
	if err != nil {
		return false, err
	}
	if err := cfg.Validate(); err != nil {
		return false, err
	}
	var created bool
	err = s.do(func(b *batch) error {
		st, err := b.group(name)
		if err == nil {
			if st.meta.Config != cfg {
				st.meta.Config, st.metaDirty = cfg, true
			}
			return nil
		}
		if !errors.Is(err, ErrGroupNotFound) {
			return err
		}
		now := time.Now()
		_, err = b.create(name, groupMeta{Share: share, Filter: filter, Created: now, Config: cfg}, now)
		created = err == nil
		return err
	})
	return created, err
}

// DeleteGroup implements GroupStore.
func (s *Groups) DeleteGroup(name string) error {
	return s.do(func(b *batch) error {
		st, err := b.group(name)
		if err != nil {
			return err
		}
		if err := b.root.DeleteBucket([]byte(name)); err != nil {
			return fatal(err)
		}
		st.deleted = true
		return nil
	})
}

// Group implements GroupStore.
func (s *Groups) Group(name string) (GroupInfo, error) {
	if s.closed.Load() {
		return GroupInfo{}, ErrClosed
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	g := s.mu.groups[name]
	if g == nil {
		return GroupInfo{}, groupNotFound(name)
	}
	return g.st.info(name, &g.meta), nil
}

// Groups implements GroupStore.
func (s *Groups) Groups() ([]GroupInfo, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.mu.RLock()
	out := make([]GroupInfo, 0, len(s.mu.groups))
	for name, g := range s.mu.groups {
		out = append(out, g.st.info(name, &g.meta))
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b GroupInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Log implements GroupStore.
func (s *Groups) Log(name string) (keyshared.Log, error) {
	if _, err := s.Group(name); err != nil {
		return nil, err
	}
	return newGroupLog(s, name)
}

func (s *Groups) head(name string) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if g := s.mu.groups[name]; g != nil {
		return g.st.head
	}
	return 0
}

func (s *Groups) first(name string) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if g := s.mu.groups[name]; g != nil {
		return g.st.first
	}
	return 0
}

func (s *Groups) cursor(name string) (uint64, error) {
	info, err := s.Group(name)
	return info.Cursor, err
}

func (s *Groups) saveCursor(name string, c uint64) error {
	return s.do(func(b *batch) error {
		st, err := b.group(name)
		if err != nil {
			return err
		}
		if c == st.st.cursor {
			return nil
		}
		if err := st.st.checkCursor(c); err != nil {
			return fmt.Errorf("group %q: %w", name, err)
		}
		st.st.cursor, st.dirty = c, true
		return nil
	})
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

func (s *Groups) readFrom(name string, from uint64, max int, buf []keyshared.Message) ([]keyshared.Message, error) {
	if max <= 0 {
		return buf, nil
	}
	err := s.view(name, func(bk *bolt.Bucket) error {
		c := bk.Bucket(logBucket).Cursor()
		n := 0
		for k, v := c.Seek(be64(from)); k != nil && n < max; k, v = c.Next() {
			m, err := decodeMessage(v, false)
			if err != nil {
				return fmt.Errorf("%w: group %q offset %d: %w", ErrCorrupt, name, binary.BigEndian.Uint64(k), err)
			}
			m.Offset = binary.BigEndian.Uint64(k)
			buf = append(buf, m)
			n++
		}
		return nil
	})
	return buf, err
}

func (s *Groups) addDeadLetter(name string, d keyshared.DeadLetter) error {
	d.Group = name
	v := appendDeadLetter(nil, &d)
	return s.do(func(b *batch) error {
		st, err := b.group(name)
		if err != nil {
			return err
		}
		id := st.st.dlSeq + 1
		if err := st.dlq.Put(be64(id), v); err != nil {
			return fatal(err)
		}
		st.st.dlSeq, st.st.deadLetters, st.dirty = id, st.st.deadLetters+1, true
		return nil
	})
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
	d, _, err := decodeDeadLetter(v, false)
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
	return s.do(func(b *batch) error {
		st, err := b.group(name)
		if err != nil {
			return err
		}
		k := be64(id)
		if st.dlq.Get(k) == nil {
			return fmt.Errorf("%w: group %q id %d", ErrDeadLetterNotFound, name, id)
		}
		if err := st.dlq.Delete(k); err != nil {
			return fatal(err)
		}
		st.st.deadLetters, st.dirty = st.st.deadLetters-1, true
		return nil
	})
}

// ReplayDeadLetter implements GroupStore.
func (s *Groups) ReplayDeadLetter(name string, id uint64) (uint64, error) {
	var off uint64
	err := s.do(func(b *batch) error {
		st, err := b.group(name)
		if err != nil {
			return err
		}
		k := be64(id)
		v := st.dlq.Get(k)
		if v == nil {
			return fmt.Errorf("%w: group %q id %d", ErrDeadLetterNotFound, name, id)
		}
		_, enc, err := decodeDeadLetter(v, false)
		if err != nil {
			return fmt.Errorf("%w: group %q dead letter %d: %w", ErrCorrupt, name, id, err)
		}
		if off, err = b.appendEntry(st, enc, uint64(len(enc))); err != nil {
			return err
		}
		if err := st.dlq.Delete(k); err != nil {
			return fatal(err)
		}
		st.st.deadLetters--
		return nil
	})
	if err != nil {
		return 0, err
	}
	return off, nil
}

// PurgeDeadLetters implements GroupStore.
func (s *Groups) PurgeDeadLetters(name string) (int, error) {
	var n int
	err := s.do(func(b *batch) error {
		st, err := b.group(name)
		if err != nil {
			return err
		}
		n = int(st.st.deadLetters)
		if n == 0 {
			return nil
		}
		if err := st.bucket.DeleteBucket(dlqBucket); err != nil {
			return fatal(err)
		}
		if st.dlq, err = st.bucket.CreateBucket(dlqBucket); err != nil {
			return fatal(err)
		}
		st.st.deadLetters, st.dirty = 0, true
		return nil
	})
	return n, err
}

// MembersChanged implements GroupStore.
func (s *Groups) MembersChanged(name string, members int, now time.Time) error {
	return s.do(func(b *batch) error {
		st, err := b.group(name)
		if err != nil {
			return err
		}
		st.st.members = max(members, 0)
		if active := members > 0; active != st.st.active {
			st.st.active, st.st.lastSeen, st.dirty = active, timeNanos(now), true
		}
		return nil
	})
}

// SweepIdle implements GroupStore.
func (s *Groups) SweepIdle(now time.Time, ttl time.Duration) ([]string, error) {
	var swept []string
	err := s.do(func(b *batch) error {
		swept = swept[:0]
		s.mu.RLock()
		names := make([]string, 0, len(s.mu.groups))
		for name := range s.mu.groups {
			names = append(names, name)
		}
		s.mu.RUnlock()
		slices.Sort(names)
		for _, name := range names {
			st, err := b.group(name)
			if err != nil {
				if isFatal(err) {
					return err
				}
				continue
			}
			if st.st.members > 0 || st.st.pending() > 0 || st.st.deadLetters > 0 || now.Sub(timeFromNanos(st.st.lastSeen)) < ttl {
				continue
			}
			if err := b.root.DeleteBucket([]byte(name)); err != nil {
				return fatal(err)
			}
			st.deleted = true
			swept = append(swept, name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return swept, nil
}

// Flush implements GroupStore.
func (s *Groups) Flush() error {
	ch := make(chan struct{})
	o := &op{apply: func(*batch) error { return nil }, flush: true, complete: func(*op) { close(ch) }}
	s.submit(o)
	<-ch
	return o.err
}
