package persistence

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Committer limits.
const (
	// maxBatchOps and maxBatchBytes bound one transaction so that one commit's
	// latency stays bounded under a flood.
	maxBatchOps   = 8192
	maxBatchBytes = 16 << 20
	// maxQueueBytes bounds the appended bytes waiting for the committer;
	// submitters wait for room beyond it.
	maxQueueBytes = 64 << 20
	// trimBudget bounds the resolved entries one transaction deletes in the
	// background, so trimming keeps up with acks without delaying appends much.
	trimBudget = 8192
)

// op is one request to the committer. The committer applies ops in submission
// order, many per bbolt transaction, and completes each after its transaction
// commits (or fails).
type op struct {
	// append: groups and enc (the encoded message) are set and apply is nil.
	groups []string
	one    [1]string // backing array of groups for single appends
	enc    []byte
	res    []AppendResult

	// any other op: apply changes the batch; a plain error fails only this op
	// (and must leave the transaction untouched); a fatalError aborts the transaction.
	apply func(b *batch) error
	// flush ops complete only once no trimming is left.
	flush bool

	size uint64 // bytes counted against maxQueueBytes and maxBatchBytes
	err  error  // the op's outcome, set by apply or by a failed commit
	skip bool   // failed an earlier attempt at this batch; not applied again

	// Exactly one completion: done is closed by the committer (blocking
	// callers); complete runs on the notifier after the commit.
	done     chan struct{}
	complete func(o *op)
}

// fatalError wraps an error that aborts the whole transaction (a bbolt error
// in the middle of writing).
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

func isFatal(err error) bool {
	var fe fatalError
	return errors.As(err, &fe)
}

func fatal(err error) error {
	if err == nil {
		return nil
	}
	return fatalError{err}
}

// queue holds the ops waiting for the committer.
type queue struct {
	mu struct {
		sync.Mutex
		ops    []*op
		bytes  uint64
		closed bool
		room   chan struct{} // closed when the committer takes ops; replaced
	}
	wake chan struct{} // capacity 1
}

func newQueue() *queue {
	q := &queue{wake: make(chan struct{}, 1)}
	q.mu.room = make(chan struct{})
	return q
}

// push queues o, waiting while the queue holds maxQueueBytes. It fails with
// ErrClosed once the queue is closed.
func (q *queue) push(o *op) error {
	q.mu.Lock()
	for !q.mu.closed && q.mu.bytes > 0 && q.mu.bytes+o.size > maxQueueBytes {
		room := q.mu.room
		q.mu.Unlock()
		<-room
		q.mu.Lock()
	}
	if q.mu.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	q.mu.ops = append(q.mu.ops, o)
	q.mu.bytes += o.size
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// take moves up to one batch of ops into dst. With wait set it blocks until
// there is at least one op or the queue is closed. closed reports that the
// queue is closed and empty.
func (q *queue) take(dst []*op, wait bool) (ops []*op, closed bool) {
	for {
		q.mu.Lock()
		if len(q.mu.ops) > 0 || q.mu.closed || !wait {
			break
		}
		q.mu.Unlock()
		<-q.wake
	}
	defer q.mu.Unlock()
	n, bytes := 0, uint64(0)
	for n < len(q.mu.ops) && n < maxBatchOps && (n == 0 || bytes+q.mu.ops[n].size <= maxBatchBytes) {
		bytes += q.mu.ops[n].size
		n++
	}
	dst = append(dst, q.mu.ops[:n]...)
	clear(q.mu.ops[:n])
	q.mu.ops = q.mu.ops[n:]
	if len(q.mu.ops) == 0 {
		q.mu.ops = q.mu.ops[:0:0] // let the backing array go; append starts afresh
	}
	if n > 0 {
		q.mu.bytes -= bytes
		close(q.mu.room)
		q.mu.room = make(chan struct{})
	}
	return dst, q.mu.closed && len(q.mu.ops) == 0
}

func (q *queue) close() {
	q.mu.Lock()
	q.mu.closed = true
	close(q.mu.room)
	q.mu.room = make(chan struct{})
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// run is the committer: the only goroutine that writes group data.
func (s *Groups) run() {
	defer s.wg.Done()
	var ops, deferred []*op
	stalled := false // the last commit failed: trimming waits for the next op
	for {
		ops = append(ops[:0], deferred...)
		deferred = deferred[:0]
		var closed bool
		ops, closed = s.q.take(ops, len(ops) == 0 && (len(s.trimQueue) == 0 || stalled))
		if len(ops) == 0 && closed {
			return
		}
		start := time.Now()
		stalled = !s.commit(ops)
		took := time.Since(start)
		released := 0
		for i, o := range ops {
			// A flush waits for trimming; after a failed commit it reports the failure.
			if o.flush && o.err == nil && len(s.trimQueue) > 0 && !stalled {
				deferred = append(deferred, o)
			} else {
				if o.complete == nil {
					released++
				}
				s.finish(o)
			}
			ops[i] = nil
		}
		s.flushNotices()
		if released > 1 && !stalled {
			s.q.linger(released, start.Add(took+took/lingerFraction))
		}
	}
}

// lingerFraction bounds how long the committer waits for released callers to
// come back, as a fraction of the last commit's duration.
const lingerFraction = 4

// linger gives the callers that the last commit released a moment to submit
// their next operation before the committer takes the next batch: without it,
// N blocking appenders split into two cohorts that alternate, each commit
// holding N/2 of them. It yields the processor (timers are too coarse here)
// until released more ops have been queued than were queued on entry, until
// a few yields in a row bring nothing new, until the deadline, or until the
// queue closes.
func (q *queue) linger(released int, deadline time.Time) {
	const maxIdleYields = 3
	want, last, idle := -1, -1, 0
	for {
		q.mu.Lock()
		n, closed := len(q.mu.ops), q.mu.closed
		q.mu.Unlock()
		if want < 0 {
			want = n + released
		}
		if n == last {
			idle++
		} else {
			idle = 0
		}
		last = n
		if n >= want || closed || idle > maxIdleYields || !time.Now().Before(deadline) {
			return
		}
		runtime.Gosched()
	}
}

// commit applies ops (and some background trimming) in one transaction,
// retrying without an op whose apply aborted the transaction. It reports
// whether the transaction committed.
func (s *Groups) commit(ops []*op) bool {
	for {
		b := &batch{s: s, staged: make(map[string]*staged), culprit: -1}
		err := s.db.bolt.Update(func(tx *bolt.Tx) error {
			b.tx = tx
			b.root = tx.Bucket(groupsBucket)
			for i, o := range ops {
				if o.skip {
					continue
				}
				o.err = nil
				var err error
				if o.apply == nil {
					err = b.appendOp(o)
				} else {
					err = o.apply(b)
				}
				if fe := (fatalError{}); errors.As(err, &fe) {
					b.culprit = i
					return fe.err
				}
				o.err = err
			}
			if err := b.trim(trimBudget); err != nil {
				return err
			}
			return b.writeStates()
		})
		if err == nil {
			s.publish(b)
			s.commits.Add(1)
			s.committedOps.Add(uint64(len(ops)))
			return true
		}
		if b.culprit >= 0 && len(ops) > 1 {
			o := ops[b.culprit]
			o.err, o.skip = fmt.Errorf("persistence: write: %w", err), true
			for i := range o.res {
				o.res[i].Offset, o.res[i].Err = 0, o.err
			}
			s.log.Error("operation aborted its transaction; retrying the rest of the batch", "err", err)
			continue
		}
		s.commitErrors.Add(1)
		err = fmt.Errorf("persistence: commit %s: %w", s.db.path, err)
		s.log.Error("commit failed", "ops", len(ops), "err", err)
		for _, o := range ops {
			if !o.skip {
				o.err = err
				for i := range o.res {
					o.res[i].Offset, o.res[i].Err = 0, err
				}
			}
		}
		return false
	}
}

// finish completes o: blocking callers are released at once, callbacks go to the notifier.
func (s *Groups) finish(o *op) {
	if o.complete == nil {
		close(o.done)
		return
	}
	s.notices = append(s.notices, o)
}

// flushNotices hands the completed callbacks and the append notifications of
// the last commit to the notifier as one closure.
func (s *Groups) flushNotices() {
	if len(s.notices) == 0 && len(s.heads) == 0 {
		return
	}
	ops, heads := s.notices, s.heads
	s.notices, s.heads = nil, nil
	fn := s.onAppend.Load()
	s.notify.push(func() {
		for _, o := range ops {
			if !o.flush {
				o.complete(o)
			}
		}
		if fn != nil && *fn != nil {
			for _, h := range heads {
				(*fn)(h.group, h.head)
			}
		}
		for _, o := range ops { // a flush returns after everything before it
			if o.flush {
				o.complete(o)
			}
		}
	})
}

type groupHead struct {
	group string
	head  uint64
}

// publish makes a committed batch visible: the in-memory groups take the
// staged states, and groups with entries at or below their cursor join the
// trim queue.
func (s *Groups) publish(b *batch) {
	s.mu.Lock()
	for name, st := range b.staged {
		switch {
		case st.deleted:
			delete(s.mu.groups, name)
		case st.g == nil:
			s.mu.groups[name] = &group{meta: st.meta, st: st.st}
		default:
			st.g.meta, st.g.st = st.meta, st.st
		}
	}
	s.mu.Unlock()
	for name, st := range b.staged {
		if !st.deleted && st.st.trimmable() {
			s.trimQueue[name] = struct{}{}
		} else {
			delete(s.trimQueue, name)
		}
		if st.appended {
			s.heads = append(s.heads, groupHead{name, st.st.head})
		}
	}
}

// Bucket and key names.
var (
	groupsBucket = []byte("groups")
	metaKey      = []byte("meta")
	stateKey     = []byte("state")
	logBucket    = []byte("log")
	dlqBucket    = []byte("dlq")
)

// batch is the working state of one transaction. Every group an op touches is
// staged: a copy of its committed state that the ops change and that becomes
// the committed state only if the transaction commits.
type batch struct {
	s       *Groups
	tx      *bolt.Tx
	root    *bolt.Bucket
	staged  map[string]*staged
	culprit int // index of the op that aborted the transaction, -1 if none
}

type staged struct {
	name string
	g    *group // nil for a group created in this batch
	meta groupMeta
	st   groupState

	bucket, log, dlq *bolt.Bucket

	deleted, created, dirty, metaDirty, appended bool
}

// group returns the staged group, or ErrGroupNotFound.
func (b *batch) group(name string) (*staged, error) {
	if st, ok := b.staged[name]; ok {
		if st.deleted {
			return nil, groupNotFound(name)
		}
		return st, nil
	}
	b.s.mu.RLock()
	g := b.s.mu.groups[name]
	b.s.mu.RUnlock()
	if g == nil {
		return nil, groupNotFound(name)
	}
	bk := b.root.Bucket([]byte(name))
	if bk == nil {
		return nil, fatal(fmt.Errorf("%w: group %q is in memory but has no bucket", ErrCorrupt, name))
	}
	st := &staged{name: name, g: g, meta: g.meta, st: g.st, bucket: bk, log: bk.Bucket(logBucket), dlq: bk.Bucket(dlqBucket)}
	if st.log == nil || st.dlq == nil {
		return nil, fatal(fmt.Errorf("%w: group %q lacks its log or dlq bucket", ErrCorrupt, name))
	}
	st.log.FillPercent = 1 // keys only ever grow at the end
	b.staged[name] = st
	return st, nil
}

// create stages a new group.
func (b *batch) create(name string, meta groupMeta, now time.Time) (*staged, error) {
	key := []byte(name)
	if b.root.Bucket(key) != nil {
		// A group deleted earlier in this batch: its bucket goes first.
		if err := b.root.DeleteBucket(key); err != nil {
			return nil, fatal(err)
		}
	}
	bk, err := b.root.CreateBucket(key)
	if err != nil {
		return nil, fatal(err)
	}
	lb, err := bk.CreateBucket(logBucket)
	if err != nil {
		return nil, fatal(err)
	}
	db, err := bk.CreateBucket(dlqBucket)
	if err != nil {
		return nil, fatal(err)
	}
	lb.FillPercent = 1
	st := &staged{name: name, meta: meta, st: newGroupState(now), bucket: bk, log: lb, dlq: db,
		created: true, dirty: true, metaDirty: true}
	b.staged[name] = st
	return st, nil
}

// appendOp appends an encoded message to each of the op's groups.
func (b *batch) appendOp(o *op) error {
	size := uint64(len(o.enc))
	for i, name := range o.groups {
		o.res[i] = AppendResult{Group: name}
		st, err := b.group(name)
		if err != nil {
			if isFatal(err) {
				return err
			}
			o.res[i].Err = err
			continue
		}
		off, err := b.appendEntry(st, o.enc, size)
		if err != nil {
			if isFatal(err) {
				return err
			}
			o.res[i].Err = err
			continue
		}
		o.res[i].Offset = off
	}
	return nil
}

// appendEntry applies the group's limits and appends enc at its tail.
func (b *batch) appendEntry(st *staged, enc []byte, size uint64) (uint64, error) {
	cfg := st.meta.Config
	if cfg.MaxBytes > 0 && size > cfg.MaxBytes {
		st.st.rejected++
		return 0, fmt.Errorf("%w: group %q: message of %d bytes exceeds the limit of %d bytes", ErrBacklogFull, st.name, size, cfg.MaxBytes)
	}
	if st.st.overLimit(cfg, size) {
		// Resolved entries do not count: remove them and look again.
		if err := b.trimGroup(st, ^uint64(0)); err != nil {
			return 0, err
		}
		if st.st.overLimit(cfg, size) {
			if cfg.policy() == PolicyReject {
				st.st.rejected++
				return 0, fmt.Errorf("%w: group %q holds %d messages, %d bytes (limits %d messages, %d bytes)",
					ErrBacklogFull, st.name, st.st.pending(), st.st.bytes, cfg.MaxMessages, cfg.MaxBytes)
			}
			for st.st.msgs > 0 && st.st.overLimit(cfg, size) {
				if err := b.deleteFirst(st); err != nil {
					return 0, err
				}
				st.st.dropped++
			}
		}
	}
	off := st.st.head + 1
	if err := st.log.Put(be64(off), enc); err != nil {
		return 0, fatal(err)
	}
	st.st.head = off
	st.st.msgs++
	st.st.bytes += size
	st.dirty, st.appended = true, true
	return off, nil
}

// deleteFirst deletes the group's oldest entry.
func (b *batch) deleteFirst(st *staged) error {
	key := be64(st.st.first)
	v := st.log.Get(key)
	if v == nil {
		return fatal(fmt.Errorf("%w: group %q has no entry %d (head %d)", ErrCorrupt, st.name, st.st.first, st.st.head))
	}
	st.st.bytes -= uint64(len(v))
	if err := st.log.Delete(key); err != nil {
		return fatal(err)
	}
	st.st.first++
	st.st.msgs--
	st.dirty = true
	return nil
}

// trimGroup deletes up to n entries at or below the cursor.
func (b *batch) trimGroup(st *staged, n uint64) error {
	for ; n > 0 && st.st.trimmable(); n-- {
		if err := b.deleteFirst(st); err != nil {
			return err
		}
	}
	return nil
}

// trim spends up to budget deletions on the groups waiting in the trim queue.
func (b *batch) trim(budget uint64) error {
	for name := range b.s.trimQueue {
		if budget == 0 {
			break
		}
		st, err := b.group(name)
		if err != nil {
			if isFatal(err) {
				return err
			}
			delete(b.s.trimQueue, name) // deleted
			continue
		}
		before := st.st.msgs
		if err := b.trimGroup(st, budget); err != nil {
			return err
		}
		budget -= before - st.st.msgs
	}
	return nil
}

// writeStates writes the meta and state of every group the batch changed.
func (b *batch) writeStates() error {
	for _, st := range b.staged {
		if st.deleted {
			continue
		}
		if st.metaDirty {
			v, err := st.meta.encode()
			if err != nil {
				return err
			}
			if err := st.bucket.Put(metaKey, v); err != nil {
				return err
			}
		}
		if st.dirty {
			if err := st.bucket.Put(stateKey, st.st.encode()); err != nil {
				return err
			}
		}
	}
	return nil
}
