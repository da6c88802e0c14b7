package seglog

import (
	"sync"
	"time"
)

// Writer limits.
const (
	// maxBatchOps and maxBatchBytes bound one commit, so that its latency
	// stays bounded under a flood.
	maxBatchOps   = 8192
	maxBatchBytes = 16 << 20
	// maxQueueBytes bounds the bytes waiting for the writer; appenders wait
	// for room beyond it.
	maxQueueBytes = 64 << 20
)

type opKind uint8

const (
	opAppend opKind = iota
	opCopy          // compaction: write records again as moved records
	opSync          // completes once everything before it is durable
)

// op is one request to the writer. Append ops come from a pool and return to
// it after their callback ran.
type op struct {
	kind  opKind
	bound int       // upper bound of the frame bytes the op writes
	err   error     // set before the writer sees it: the op fails without being written
	at    time.Time // when it was queued: the commit interval counts from the oldest op of a batch

	// opAppend
	groups []uint64
	gbuf   [2]uint64
	msg    []byte
	done   func([]Result)
	res    []Result
	rbuf   [2]Result

	// opCopy
	copies []copyRec

	// opCopy and opSync: closed once the op is durable (and, for a sync
	// without durableOnly, once the callbacks before it ran).
	ch          chan struct{}
	durableOnly bool
}

var opPool = sync.Pool{New: func() any { return new(op) }}

func getAppendOp(groups []uint64, msg []byte, done func([]Result)) *op {
	o := opPool.Get().(*op)
	o.kind, o.msg, o.done = opAppend, msg, done
	o.groups = append(o.gbuf[:0], groups...)
	if len(groups) <= len(o.rbuf) {
		o.res = o.rbuf[:len(groups)]
	} else {
		o.res = make([]Result, len(groups))
	}
	clear(o.res)
	// One record holds the message for every group; room for a drop-oldest
	// resolve record per group is reserved too.
	o.bound = msgFrameBound(len(msg), len(groups)) + len(groups)*resolveFrameBound(1)
	return o
}

func putAppendOp(o *op) {
	*o = op{}
	opPool.Put(o)
}

// fail completes every result of the op with err.
func (o *op) fail(err error) {
	for i := range o.res {
		o.res[i] = Result{Err: err}
	}
}

// queue holds the ops waiting for the writer.
type queue struct {
	mu struct {
		sync.Mutex
		ops    []*op
		bytes  int
		closed bool
		room   chan struct{} // closed when the writer takes ops; replaced
		// want, while the writer gathers a batch, is the number of queued
		// ops that makes a push wake it (0: every push does).
		want int
	}
	wake chan struct{} // capacity 1
}

func newQueue() *queue {
	q := &queue{wake: make(chan struct{}, 1)}
	q.mu.room = make(chan struct{})
	return q
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// push queues o, waiting while the queue holds maxQueueBytes. It fails with
// ErrClosed once the queue is closed.
func (q *queue) push(o *op) error {
	q.mu.Lock()
	for !q.mu.closed && q.mu.bytes > 0 && q.mu.bytes+o.bound > maxQueueBytes {
		room := q.mu.room
		q.mu.Unlock()
		<-room
		q.mu.Lock()
	}
	if q.mu.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	o.at = time.Now()
	q.mu.ops = append(q.mu.ops, o)
	q.mu.bytes += o.bound
	wake := q.mu.want == 0 || len(q.mu.ops) >= q.mu.want || q.mu.bytes >= maxBatchBytes || o.kind != opAppend
	q.mu.Unlock()
	if wake {
		q.signal()
	}
	return nil
}

// take appends up to one batch of ops to dst (which may hold ops carried
// over). closed reports that the queue is closed and empty.
func (q *queue) take(dst []*op) (ops []*op, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, bytes := 0, 0
	for _, o := range dst {
		bytes += o.bound
	}
	for n < len(q.mu.ops) && len(dst)+n < maxBatchOps && (len(dst)+n == 0 || bytes+q.mu.ops[n].bound <= maxBatchBytes) {
		bytes += q.mu.ops[n].bound
		n++
	}
	dst = append(dst, q.mu.ops[:n]...)
	taken := 0
	for _, o := range q.mu.ops[:n] {
		taken += o.bound
	}
	clear(q.mu.ops[:n])
	q.mu.ops = q.mu.ops[n:]
	if len(q.mu.ops) == 0 {
		q.mu.ops = q.mu.ops[:0:0]
	}
	if n > 0 {
		q.mu.bytes -= taken
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
	q.signal()
}

// expect makes a push wake the writer only once n ops are queued (or the
// batch bytes are reached, or an op other than an append arrives); 0 wakes it
// on every push again. It reports how many ops are queued now.
func (q *queue) expect(n int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.mu.want = n
	return len(q.mu.ops)
}
