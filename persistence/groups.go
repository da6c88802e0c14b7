package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/internal/wire"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence/seglog"
)

// Groups is the durable GroupStore: each group's messages in the segment log
// (package seglog: one write and one fdatasync per commit, shared by every
// group and publisher), and its identity, settings, dead letters and
// periodic checkpoints in the data file (bbolt, through the one committer).
// Obtain it with DB.Groups; DB.Close stops it.
type Groups struct {
	db  *DB
	lg  *slog.Logger
	log *seglog.Log

	mu struct {
		sync.RWMutex
		groups map[string]*group
		byID   map[uint64]*group
		nextID uint64 // the next group id to hand out (ids are never reused)
	}
	// shape serializes creating and deleting groups.
	shape sync.Mutex

	onAppend    atomic.Pointer[func(group string, head uint64)]
	onCommitted atomic.Pointer[func()]
	closed      atomic.Bool
	ckpt        checkpointer
}

// group is one group's identity and the figures the data file keeps.
type group struct {
	name string
	meta groupMeta // changed only under Groups.shape

	// Guarded by Groups.mu.
	dlq      dlqState
	members  int
	lastSeen int64
	active   bool
	// dirty: members or lastSeen changed since the last checkpoint.
	dirty bool
	// quarantined counts records set aside because they cannot be decoded.
	quarantined uint64
}

// Bucket and key names.
var (
	groupsBucket = []byte("groups")
	metaKey      = []byte("meta")
	stateKey     = []byte("state")
	dlqStateKey  = []byte("dlq-state")
	dlqBucket    = []byte("dlq")
	keylineKey   = []byte("keyline") // in groupsBucket's parent: the next group id
)

var _ GroupStore = (*Groups)(nil)

// Groups returns the group store of db.
func (db *DB) Groups() *Groups { return db.groups }

// openGroups loads every group's meta and checkpoint from the data file and
// opens the segment log over them.
func openGroups(db *DB, segDir string) (s *Groups, err error) {
	s = &Groups{db: db, lg: db.log.With("store", "groups")}
	s.mu.groups = make(map[string]*group)
	s.mu.byID = make(map[uint64]*group)
	defer func() {
		// bbolt panics on some damaged pages; report them as corruption.
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("%w: %s: reading groups: %v", ErrCorrupt, db.path, r)
		}
	}()
	now := time.Now()
	states := make(map[uint64]seglog.GroupState)
	err = db.bolt.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(groupsBucket)
		if err != nil {
			return fmt.Errorf("persistence: create groups bucket: %w", err)
		}
		if v := tx.Bucket(groupsBucket).Get(keylineKey); v != nil {
			d := wire.NewDecoder(v, errDecode)
			s.mu.nextID = d.Uvarint()
			if d.Err() != nil {
				return fmt.Errorf("%w: %s: next group id: %w", ErrCorrupt, db.path, d.Err())
			}
		}
		s.mu.nextID = max(s.mu.nextID, 1)
		return root.ForEach(func(k, v []byte) error {
			if v != nil {
				if string(k) == string(keylineKey) {
					return nil
				}
				return fmt.Errorf("%w: %s: groups/%q is a value, not a group bucket", ErrCorrupt, db.path, k)
			}
			g, st, err := loadGroup(root.Bucket(k), string(k), now)
			if err != nil {
				return fmt.Errorf("%w: %s: group %q: %w", ErrCorrupt, db.path, k, err)
			}
			if s.mu.byID[g.meta.ID] != nil {
				return fmt.Errorf("%w: %s: groups %q and %q share id %d", ErrCorrupt, db.path, k, s.mu.byID[g.meta.ID].name, g.meta.ID)
			}
			s.mu.groups[g.name], s.mu.byID[g.meta.ID] = g, g
			s.mu.nextID = max(s.mu.nextID, g.meta.ID+1)
			states[g.meta.ID] = st.GroupState
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	s.log, err = seglog.Open(seglog.Options{
		Dir:         segDir,
		SegmentSize: db.opts.SegmentSize,
		NoSync:      db.opts.NoSync,
		CacheBytes:  db.opts.CacheBytes,
		OnAppend:    s.appended,
		AfterCallbacks: func() {
			if fn := s.onCommitted.Load(); fn != nil && *fn != nil {
				(*fn)()
			}
		},
		Logger:       db.log.With("store", "segments"),
		ResolveDelay: 0,
		// How long an append may wait for others to share its commit.
		CommitInterval:   db.opts.CommitInterval,
		CommitMinAppends: db.opts.CommitMinAppends,
	}, states)
	if err != nil {
		return nil, fmt.Errorf("persistence: message log %s: %w", segDir, err)
	}
	rep := s.log.Recovery()
	if rep.TornBytes > 0 || rep.Corrupt > 0 || rep.Lost > 0 {
		s.lg.Warn("message log recovered with losses", "torn_bytes", rep.TornBytes, "damaged_stretches", rep.Corrupt,
			"quarantined", strings.Join(rep.Quarantined, ","), "lost_offsets", rep.Lost)
	}
	s.lg.Debug("message log opened", "segments", rep.Segments, "bytes", rep.Bytes, "live", rep.Live, "took", rep.Took)
	for _, g := range s.mu.groups {
		if err := s.log.SetLimits(g.meta.ID, g.meta.Config.Limits()); err != nil {
			_ = s.log.Close()
			return nil, fmt.Errorf("persistence: group %q: %w", g.name, err)
		}
	}
	s.ckpt.start(s, db.opts.CheckpointInterval)
	return s, nil
}

// loadGroup reads one group's meta, checkpoint and dead-letter counters.
func loadGroup(bk *bolt.Bucket, name string, now time.Time) (*group, groupState, error) {
	if _, _, err := splitGroupName(name); err != nil {
		return nil, groupState{}, err
	}
	mv, sv := bk.Get(metaKey), bk.Get(stateKey)
	if mv == nil || sv == nil || bk.Bucket(dlqBucket) == nil {
		return nil, groupState{}, errors.New("missing meta, state or dlq")
	}
	meta, err := decodeMeta(mv)
	if err != nil {
		return nil, groupState{}, err
	}
	if meta.ID == 0 {
		return nil, groupState{}, errors.New("meta has no group id (written by an earlier keyline that kept group logs in this file; start with an empty data dir)")
	}
	st, err := decodeState(sv)
	if err != nil {
		return nil, groupState{}, err
	}
	g := &group{name: name, meta: meta, lastSeen: st.lastSeen}
	if q := bk.Bucket(quarantineBucket); q != nil {
		g.quarantined = uint64(q.Stats().KeyN)
	}
	if v := bk.Get(dlqStateKey); v != nil {
		if g.dlq, err = decodeDLQState(v); err != nil {
			return nil, groupState{}, err
		}
	}
	if st.active {
		// The broker stopped while the group had members: the idle TTL starts now.
		g.lastSeen = timeNanos(now)
	}
	return g, st, nil
}

// appended is the segment log's OnAppend: it names the group for the
// store's listener.
func (s *Groups) appended(id, head uint64) {
	fn := s.onAppend.Load()
	if fn == nil || *fn == nil {
		return
	}
	s.mu.RLock()
	g := s.mu.byID[id]
	s.mu.RUnlock()
	if g != nil {
		(*fn)(g.name, head)
	}
}

// close stops the checkpointer (it takes a last checkpoint) and closes the log.
func (s *Groups) close() error {
	if s.closed.Swap(true) {
		return nil
	}
	errs := []error{s.ckpt.stop()}
	if err := s.log.Close(); err != nil {
		errs = append(errs, fmt.Errorf("persistence: close message log: %w", err))
	}
	return errors.Join(errs...)
}

func (s *Groups) lookup(name string) (*group, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.mu.RLock()
	g := s.mu.groups[name]
	s.mu.RUnlock()
	if g == nil {
		return nil, groupNotFound(name)
	}
	return g, nil
}

// EnsureGroup implements GroupStore.
func (s *Groups) EnsureGroup(name string, cfg GroupConfig) (bool, error) {
	shareName, filter, err := splitGroupName(name)
	if err != nil {
		return false, err
	}
	if err := cfg.Validate(); err != nil {
		return false, err
	}
	s.shape.Lock()
	defer s.shape.Unlock()
	if s.closed.Load() {
		return false, ErrClosed
	}
	s.mu.RLock()
	g := s.mu.groups[name]
	s.mu.RUnlock()
	if g != nil {
		if g.meta.Config == cfg {
			return false, nil
		}
		meta := g.meta
		meta.Config = cfg
		if err := s.putMeta(name, meta); err != nil {
			return false, err
		}
		g.meta = meta
		return false, s.log.SetLimits(meta.ID, cfg.Limits())
	}
	s.mu.Lock()
	id := s.mu.nextID
	s.mu.nextID++
	s.mu.Unlock()
	now := time.Now()
	meta := groupMeta{ID: id, Share: shareName, Filter: filter, Created: now, Config: cfg}
	mv, err := meta.encode()
	if err != nil {
		return false, err
	}
	st := groupState{lastSeen: timeNanos(now)}
	err = s.db.commit.do(func(tx *bolt.Tx) error {
		root := tx.Bucket(groupsBucket)
		if err := root.Put(keylineKey, binaryUvarint(id+1)); err != nil {
			return fatal(err)
		}
		bk, err := root.CreateBucket([]byte(name))
		if err != nil {
			return fatal(err)
		}
		if _, err := bk.CreateBucket(dlqBucket); err != nil {
			return fatal(err)
		}
		for _, kv := range [][2][]byte{{metaKey, mv}, {stateKey, st.encode()}, {dlqStateKey, dlqState{}.encode()}} {
			if err := bk.Put(kv[0], kv[1]); err != nil {
				return fatal(err)
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("persistence: create group %q: %w", name, err)
	}
	if err := s.log.AddGroup(id, seglog.GroupState{}, cfg.Limits()); err != nil {
		return false, fmt.Errorf("persistence: create group %q: %w", name, err)
	}
	g = &group{name: name, meta: meta, lastSeen: st.lastSeen}
	s.mu.Lock()
	s.mu.groups[name], s.mu.byID[id] = g, g
	s.mu.Unlock()
	return true, nil
}

func binaryUvarint(v uint64) []byte { return binary.AppendUvarint(nil, v) }

// putMeta rewrites a group's meta.
func (s *Groups) putMeta(name string, meta groupMeta) error {
	mv, err := meta.encode()
	if err != nil {
		return err
	}
	return s.db.commit.do(func(tx *bolt.Tx) error {
		bk := tx.Bucket(groupsBucket).Bucket([]byte(name))
		if bk == nil {
			return groupNotFound(name)
		}
		return fatal(bk.Put(metaKey, mv))
	})
}

// DeleteGroup implements GroupStore.
func (s *Groups) DeleteGroup(name string) error {
	s.shape.Lock()
	defer s.shape.Unlock()
	g, err := s.lookup(name)
	if err != nil {
		return err
	}
	return s.deleteLocked(g)
}

// deleteLocked deletes g (shape held): first from the data file (durably),
// then from the log, whose records of it become garbage.
func (s *Groups) deleteLocked(g *group) error {
	err := s.db.commit.do(func(tx *bolt.Tx) error {
		return fatal(tx.Bucket(groupsBucket).DeleteBucket([]byte(g.name)))
	})
	if err != nil {
		return fmt.Errorf("persistence: delete group %q: %w", g.name, err)
	}
	s.mu.Lock()
	delete(s.mu.groups, g.name)
	delete(s.mu.byID, g.meta.ID)
	s.mu.Unlock()
	s.log.DropGroup(g.meta.ID)
	return nil
}

// Group implements GroupStore.
func (s *Groups) Group(name string) (GroupInfo, error) {
	g, err := s.lookup(name)
	if err != nil {
		return GroupInfo{}, err
	}
	return s.info(g)
}

func (s *Groups) info(g *group) (GroupInfo, error) {
	li, err := s.log.Group(g.meta.ID)
	if err != nil {
		if errors.Is(err, seglog.ErrGroupNotFound) {
			return GroupInfo{}, groupNotFound(g.name)
		}
		return GroupInfo{}, fmt.Errorf("persistence: group %q: %w", g.name, err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return GroupInfo{
		Name: g.name, Share: g.meta.Share, Filter: g.meta.Filter, Created: g.meta.Created, Config: g.meta.Config,
		Head: li.Head, Cursor: li.DurableCursor, Backlog: li.Messages,
		StoredMessages: li.Messages, StoredBytes: li.Bytes,
		Dropped: li.Dropped, Rejected: li.Refused, DeadLetters: g.dlq.count, Unsynced: li.Unsynced,
		Quarantined: g.quarantined, Lost: li.Lost,
		Members: g.members, LastSeen: timeFromNanos(g.lastSeen),
	}, nil
}

// Groups implements GroupStore.
func (s *Groups) Groups() ([]GroupInfo, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.mu.RLock()
	gs := make([]*group, 0, len(s.mu.groups))
	for _, g := range s.mu.groups {
		gs = append(gs, g)
	}
	s.mu.RUnlock()
	out := make([]GroupInfo, 0, len(gs))
	for _, g := range gs {
		info, err := s.info(g)
		if errors.Is(err, ErrGroupNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b GroupInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Log implements GroupStore.
func (s *Groups) Log(name string) (keyshared.Log, error) {
	g, err := s.lookup(name)
	if err != nil {
		return nil, err
	}
	return &segLog{s: s, g: g}, nil
}

// --- appends ---

// logResults turns the segment log's results into AppendResults.
func logResults(names []string, rs []seglog.Result) []AppendResult {
	out := make([]AppendResult, len(names))
	for i, name := range names {
		out[i] = AppendResult{Group: name, Offset: rs[i].Offset, Err: logError(name, rs[i].Err)}
	}
	return out
}

// logError maps a segment log error to this package's.
func logError(name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, seglog.ErrBacklogFull):
		return fmt.Errorf("%w: group %q: %v", ErrBacklogFull, name, err)
	case errors.Is(err, seglog.ErrGroupNotFound):
		return groupNotFound(name)
	case errors.Is(err, seglog.ErrClosed):
		return ErrClosed
	case errors.Is(err, seglog.ErrTooLarge):
		return fmt.Errorf("%w: group %q: %v", ErrBacklogFull, name, err)
	}
	return fmt.Errorf("persistence: group %q: %w", name, err)
}

// ids resolves group names to log ids; unknown names get id 0 (the log
// refuses them with ErrGroupNotFound).
func (s *Groups) ids(names []string) []uint64 {
	ids := make([]uint64, len(names))
	s.mu.RLock()
	for i, n := range names {
		if g := s.mu.groups[n]; g != nil {
			ids[i] = g.meta.ID
		}
	}
	s.mu.RUnlock()
	return ids
}

// AppendMultiAsync implements GroupStore.
func (s *Groups) AppendMultiAsync(groups []string, m keyshared.Message, done func([]AppendResult)) {
	names := slices.Clone(groups)
	if s.closed.Load() {
		rs := make([]seglog.Result, len(names))
		for i := range rs {
			rs[i].Err = seglog.ErrClosed
		}
		done(logResults(names, rs))
		return
	}
	s.log.Append(s.ids(names), keyshared.EncodeMessage(&m), func(rs []seglog.Result) { done(logResults(names, rs)) })
}

// AppendAsync implements GroupStore.
func (s *Groups) AppendAsync(group string, m keyshared.Message, done func(offset uint64, err error)) {
	s.AppendMultiAsync([]string{group}, m, func(rs []AppendResult) { done(rs[0].Offset, rs[0].Err) })
}

// AppendMulti implements GroupStore.
func (s *Groups) AppendMulti(groups []string, m keyshared.Message) []AppendResult {
	ch := make(chan []AppendResult, 1)
	s.AppendMultiAsync(groups, m, func(rs []AppendResult) { ch <- rs })
	return <-ch
}

// Append implements GroupStore.
func (s *Groups) Append(group string, m keyshared.Message) (uint64, error) {
	rs := s.AppendMulti([]string{group}, m)
	return rs[0].Offset, rs[0].Err
}

// OnAppend implements GroupStore.
func (s *Groups) OnAppend(fn func(group string, head uint64)) { s.onAppend.Store(&fn) }

// OnCommitted sets fn to run after the callbacks of every commit of the
// message log have run (AppendMultiAsync's done calls and OnAppend), on the
// goroutine that ran them: what they deferred is done there once per commit.
// A done call that reports success always runs before one of these.
func (s *Groups) OnCommitted(fn func()) { s.onCommitted.Store(&fn) }

// MembersChanged implements GroupStore. The count and the time are kept in
// memory and written with the next checkpoint.
func (s *Groups) MembersChanged(name string, members int, now time.Time) error {
	g, err := s.lookup(name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g.members = max(members, 0)
	if active := members > 0; active != g.active {
		g.active, g.lastSeen = active, timeNanos(now)
	}
	g.dirty = true
	return nil
}

// internalGroup reports whether name is one of the broker's own groups,
// which no idle sweep deletes (keyshared.Backend's contract).
func internalGroup(name string) bool { return strings.HasPrefix(name, share.InternalPrefix) }

// SweepIdle implements GroupStore.
func (s *Groups) SweepIdle(now time.Time, ttl time.Duration) ([]string, error) {
	s.shape.Lock()
	defer s.shape.Unlock()
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.mu.RLock()
	var idle []*group
	for _, g := range s.mu.groups {
		if g.members == 0 && g.dlq.count == 0 && now.Sub(timeFromNanos(g.lastSeen)) >= ttl && !internalGroup(g.name) {
			idle = append(idle, g)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(idle, func(a, b *group) int { return strings.Compare(a.name, b.name) })
	var swept []string
	for _, g := range idle {
		li, err := s.log.Group(g.meta.ID)
		if err != nil || li.Messages > 0 {
			continue // holds messages: never swept
		}
		if err := s.deleteLocked(g); err != nil {
			return swept, err
		}
		swept = append(swept, g.name)
	}
	return swept, nil
}

// Flush implements GroupStore: the log's commits, then the data file's.
func (s *Groups) Flush() error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.log.Sync(); err != nil {
		return logError("", err)
	}
	return s.db.commit.sync()
}
