package seglog

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/keyline-mq/keyline/internal/notify"
)

// Log is a segment log shared by all groups. All methods are safe for
// concurrent use.
type Log struct {
	opts   Options
	log    *slog.Logger
	lock   *os.File // Dir/LOCK, flocked while open
	q      *queue
	notify *notify.Notifier
	prep   *preparer
	wg     sync.WaitGroup // writer and compactor
	stop   chan struct{}  // closed by Close: the compactor stops
	wakeC  chan struct{}  // capacity 1: the compactor has work to look at

	report    RecoveryReport
	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error
	w         writer // owned by the writer goroutine

	mu struct {
		sync.Mutex
		groups map[uint64]*group
		// retired holds ids that may not be added again: dropped, or found in
		// the log at Open without a checkpoint.
		retired map[uint64]struct{}
		// segs holds the segment files by ascending id; the last is the
		// active one (the writer's), every other one is sealed.
		segs []*segment
		// pendingGroups lists the groups with pending resolutions, and
		// pendingSince is when the oldest of them arrived.
		pendingGroups []*group
		pendingSince  time.Time
		// resolveTimer wakes the writer ResolveDelay after resolutions
		// began to wait, unless an append commit took them first.
		resolveTimer *time.Timer
		// cached lists the groups with cache entries; cacheBytes is their sum.
		cached     []*group
		cacheBytes int64
		evictNext  uint64
		closed     bool
		failed     error // set once by the writer: every later append fails with it
		// ckptSeq numbers snapshots; ckptDone is the newest one Checkpointed.
		ckptSeq, ckptDone uint64
	}

	stats struct {
		commits, syncs, resolveCommits, commitFailures           atomic.Uint64
		bytes, records, appends, moved, resolveRecs              atomic.Uint64
		compactions, removed, cacheHits, cacheMisses, writeNanos atomic.Uint64
		damaged, commitWaits, sparseCommits                      atomic.Uint64
	}
}

// Open opens the log in opts.Dir, creating the directory if needed, and
// recovers its state: groups holds every group to keep, with the state of
// its last persisted checkpoint (a zero GroupState for a group added after
// it). Records of other groups are garbage. Open fails (wrapping
// ErrBadOptions, ErrLocked or ErrUnusable) only if the log cannot be used;
// damage inside segments is repaired or quarantined and reported by
// Recovery.
func Open(opts Options, groups map[uint64]GroupState) (*Log, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	lock, err := lockDir(opts.Dir, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	l := &Log{opts: opts, log: opts.Logger.With("log", opts.Dir), lock: lock, q: newQueue(),
		stop: make(chan struct{}), wakeC: make(chan struct{}, 1)}
	l.mu.groups = make(map[uint64]*group, len(groups))
	l.mu.retired = make(map[uint64]struct{})
	for id, st := range groups {
		l.mu.groups[id] = newGroup(id, st, Limits{})
	}
	spare, err := l.recover()
	if err != nil {
		for _, s := range l.mu.segs {
			s.f.Close()
		}
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	if opts.ReadOnly {
		if spare != nil {
			spare.f.Close()
		}
		l.q.close()
		return l, nil
	}
	l.prep = startPreparer(opts.Dir, opts.SegmentSize, opts.NoSync)
	if spare != nil {
		l.prep.ready <- prepared{seg: spare}
	} else {
		l.prep.req <- l.active().id + 1
	}
	l.notify = notify.New()
	l.wg.Add(2)
	go l.runWriter()
	go l.runCompactor()
	l.wakeCompactor()
	return l, nil
}

// lockDir takes the directory's lock: exclusive, creating the directory
// and its LOCK file if needed, or shared for a read-only log (none if there
// is no LOCK file: nobody ever wrote there).
func lockDir(dir string, readOnly bool) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	how := syscall.LOCK_EX
	var lock *os.File
	var err error
	if readOnly {
		how = syscall.LOCK_SH
		if lock, err = os.Open(path); errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
		}
		lock, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
	}
	if err := syscall.Flock(int(lock.Fd()), how|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
		}
		return nil, fmt.Errorf("%w: lock %s: %w", ErrUnusable, dir, err)
	}
	return lock, nil
}

// active returns the active segment (Log.mu or the writer).
func (l *Log) active() *segment { return l.mu.segs[len(l.mu.segs)-1] }

// Recovery returns what Open found and repaired.
func (l *Log) Recovery() RecoveryReport { return l.report }

// AddGroup adds a group with state st (usually zero) and limits lim. It
// fails with ErrGroupExists for an id the log knows or knew.
func (l *Log) AddGroup(id uint64, st GroupState, lim Limits) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return ErrClosed
	}
	if _, ok := l.mu.groups[id]; ok {
		return fmt.Errorf("%w: group %d exists", ErrGroupExists, id)
	}
	if _, ok := l.mu.retired[id]; ok {
		return fmt.Errorf("%w: group %d was dropped or has records without a checkpoint", ErrGroupExists, id)
	}
	l.mu.groups[id] = newGroup(id, st, lim)
	return nil
}

// SetLimits changes a group's limits; they apply to later appends.
func (l *Log) SetLimits(id uint64, lim Limits) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.mu.groups[id]
	if g == nil {
		return fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	}
	g.lim = lim
	return nil
}

// DropGroup forgets a group: its records become garbage and its id can never
// be added again. Appends to it still queued fail with ErrGroupNotFound.
func (l *Log) DropGroup(id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.mu.groups[id]
	if g == nil {
		return
	}
	delete(l.mu.groups, id)
	l.mu.retired[id] = struct{}{}
	g.removed = true
	for i := range g.runs {
		g.runs[i].seg.live -= g.runs[i].live
	}
	g.runs, g.msgs, g.bytes = nil, 0, 0
	g.pending.reset()
	l.cacheClearLocked(g, g.head+1)
	l.wakeCompactor()
}

// Resolve marks offsets of a group resolved (acknowledged, dead-lettered,
// dropped...). It never blocks on I/O and is idempotent; offsets at or
// below the cursor, above the head or of an unknown group are ignored. The
// resolutions are written with the next append commit, or alone after
// Options.ResolveDelay; a crash may lose those of that interval.
func (l *Log) Resolve(id uint64, offsets []uint64) {
	l.mu.Lock()
	g := l.mu.groups[id]
	if g == nil || l.mu.closed {
		l.mu.Unlock()
		return
	}
	wasPending := len(l.mu.pendingGroups) > 0
	for _, off := range offsets {
		l.resolveLocked(g, off, false)
	}
	g.advanceLocked()
	if !wasPending && len(l.mu.pendingGroups) > 0 {
		// Not a wake-up now: the next append commit takes them, or the
		// writer is woken when ResolveDelay has passed.
		if l.mu.resolveTimer == nil {
			l.mu.resolveTimer = time.AfterFunc(l.opts.ResolveDelay, l.q.signal)
		} else {
			l.mu.resolveTimer.Reset(l.opts.ResolveDelay)
		}
	}
	l.mu.Unlock()
}

// Group returns a group's figures.
func (l *Log) Group(id uint64) (GroupInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.mu.groups[id]
	if g == nil {
		return GroupInfo{}, fmt.Errorf("%w: %d", ErrGroupNotFound, id)
	}
	return GroupInfo{Head: g.head, Cursor: g.cursor, DurableCursor: g.durableCursor(),
		Messages: g.msgs, Bytes: g.bytes, Dropped: g.dropped, Refused: g.refused, Lost: g.lost,
		Cached: uint64(g.cache.n()), CachedBytes: uint64(g.cache.bytes), Runs: len(g.runs), Limits: g.lim,
		Unsynced: g.pending.count() + g.inflightCount}, nil
}

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	s := Stats{
		Commits: l.stats.commits.Load(), Syncs: l.stats.syncs.Load(), ResolveCommits: l.stats.resolveCommits.Load(),
		BytesWritten: l.stats.bytes.Load(), Records: l.stats.records.Load(), Appends: l.stats.appends.Load(),
		Moved: l.stats.moved.Load(), ResolveRecords: l.stats.resolveRecs.Load(),
		Compactions: l.stats.compactions.Load(), Removed: l.stats.removed.Load(),
		CacheHits: l.stats.cacheHits.Load(), CacheMisses: l.stats.cacheMisses.Load(),
		CommitFailures: l.stats.commitFailures.Load(), WriteTime: time.Duration(l.stats.writeNanos.Load()),
		CommitWaits:   l.stats.commitWaits.Load(),
		SparseCommits: l.stats.sparseCommits.Load(),
		Damaged:       l.stats.damaged.Load(),
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.Segments = len(l.mu.segs)
	for _, sg := range l.mu.segs {
		s.SegmentBytes += sg.size
		s.LiveRecords += sg.live
	}
	if l.prep != nil && len(l.prep.ready) > 0 {
		s.Segments++ // the spare (approximately: it may be being taken)
		s.SegmentBytes += l.opts.SegmentSize
	}
	s.CacheBytes = l.mu.cacheBytes
	return s
}

// Append appends msg to each group of groups, one record per group, all in
// one commit, and calls done with one Result per group (in the order of
// groups) on the notifier goroutine after that commit; done may be nil. The
// log keeps msg (its tail cache holds it), so the caller must not modify it
// afterwards; groups is copied. The Result slice is valid only during the
// call to done. Append may wait for room when the writer is far behind.
// After Close, done is called at once with ErrClosed.
func (l *Log) Append(groups []uint64, msg []byte, done func([]Result)) {
	o := getAppendOp(groups, msg, done)
	if l.opts.ReadOnly {
		o.fail(ErrReadOnly)
		if done != nil {
			done(o.res)
		}
		putAppendOp(o)
		return
	}
	if len(msg) > MaxMessageSize || int64(o.bound) > l.opts.SegmentSize-segHeaderSize {
		o.err = fmt.Errorf("%w: %d bytes to %d groups (limit %d bytes, segment %d bytes)",
			ErrTooLarge, len(msg), len(groups), MaxMessageSize, l.opts.SegmentSize)
		o.bound = 0
	}
	if err := l.q.push(o); err != nil {
		o.fail(err)
		if done != nil {
			done(o.res)
		}
		putAppendOp(o)
	}
}

// Sync returns once everything submitted before it (appends and
// resolutions) is durable and its callbacks ran. It returns ErrClosed after
// Close, and the writer's error (ErrFailed) if a commit failed. A callback
// calls SyncFromCallback instead: Sync would wait for the running callback.
func (l *Log) Sync() error { return l.sync(false) }

// SyncFromCallback is Sync for a callback of the log: it returns once
// everything submitted before it is durable, without waiting for the
// callbacks queued behind the running one.
func (l *Log) SyncFromCallback() error { return l.sync(true) }

func (l *Log) sync(fromCallback bool) error {
	if l.opts.ReadOnly {
		return ErrReadOnly
	}
	o := &op{kind: opSync, ch: make(chan struct{}), durableOnly: fromCallback}
	if err := l.q.push(o); err != nil {
		return err
	}
	<-o.ch
	return o.err
}

// Close commits what was submitted (appends and resolutions), runs the
// callbacks, stops the goroutines and closes the files. Later calls return
// the first call's result. A callback calls CloseFromCallback instead.
func (l *Log) Close() error { return l.close(false) }

// CloseFromCallback is Close for a callback of the log: it does all that
// Close does except waiting for the callbacks queued behind the running one,
// which run after it returns (the notifier goroutine ends then). Called while
// Close runs on another goroutine (which waits for this callback), it
// returns ErrClosed at once; later calls return ErrClosed too.
func (l *Log) CloseFromCallback() error { return l.close(true) }

func (l *Log) close(fromCallback bool) error {
	if !l.closing.CompareAndSwap(false, true) && !l.opts.ReadOnly && fromCallback {
		return ErrClosed
	}
	l.closeOnce.Do(func() {
		if l.opts.ReadOnly {
			l.mu.Lock()
			l.mu.closed = true
			var errs []error
			for _, s := range l.mu.segs {
				errs = append(errs, s.f.Close())
			}
			l.mu.Unlock()
			if l.lock != nil {
				errs = append(errs, l.lock.Close())
			}
			l.closeErr = errors.Join(errs...)
			return
		}
		close(l.stop)
		l.q.close()
		l.wg.Wait()
		l.mu.Lock()
		if l.mu.resolveTimer != nil {
			l.mu.resolveTimer.Stop()
		}
		l.mu.Unlock()
		l.prep.close()
		l.notify.Close(!fromCallback)
		l.mu.Lock()
		l.mu.closed = true
		var errs []error
		for _, s := range l.mu.segs {
			errs = append(errs, s.f.Close())
		}
		errs = append(errs, l.mu.failed)
		l.mu.Unlock()
		errs = append(errs, l.lock.Close())
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// wakeCompactor tells the compactor to look for work.
func (l *Log) wakeCompactor() {
	select {
	case l.wakeC <- struct{}{}:
	default:
	}
}
