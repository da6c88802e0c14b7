package keyshared

import (
	"container/heap"
	"strconv"
	"time"
)

// entryState is where a message of the window stands.
type entryState uint8

const (
	// entryWaiting: not in flight. Either behind the head of its key
	// (blocked by it), or the head waiting to be routed: for a member with
	// room, for a member at all, or right now being routed.
	entryWaiting entryState = iota
	// entryInflight: delivered to entry.holder, awaiting its ack.
	entryInflight
	// entryRetry: an attempt failed; waits in the retry heap for its backoff.
	entryRetry
	// entryPoisoned: exhausted under PoisonBlock; its key stops.
	entryPoisoned
	// entryDLQPending: to be dead-lettered; the store failed, the heartbeat retries.
	entryDLQPending
)

// entry is one unresolved message in the window. Only the head entry of a
// key is ever in any state but entryWaiting (invariant 1).
type entry struct {
	msg Message
	ks  *keyState

	knext        *entry // next message of the same key, in log order
	oprev, onext *entry // all window entries in offset order
	dprev, dnext *entry // in-flight entries in dispatch order (ack deadlines)
	mprev, mnext *entry // in-flight entries of the same holder

	state entryState
	// holder is the member the entry is in flight on (entryInflight only).
	holder *member
	// lastMember is the member of the last delivery, "" before the first.
	lastMember string
	// attempts counts failed deliveries: nacks, ack timeouts, member losses.
	attempts int
	// deliveries counts calls to Deliver that the member took.
	deliveries int
	lastReason byte

	firstDelivery, lastDelivery time.Time
	deadline                    time.Time // ack deadline while in flight
	retryAt                     time.Time // retry time while entryRetry
	heapIdx                     int
}

// keyState is the queue of one routing key's unresolved messages, in log
// order. It exists exactly while the key has messages in the window.
type keyState struct {
	key        string
	head, tail *entry
	n          int
	// list is the wait list (a member's, or the no-member list) the key sits
	// on while its head waits to be routed; nil otherwise.
	list         *keyList
	wprev, wnext *keyState
	// stalled records that the key counts in window.stalledKeys: it has
	// messages but none in flight.
	stalled bool
}

// keyList is an intrusive FIFO of keys waiting for a member.
type keyList struct {
	head, tail *keyState
	n          int
}

func (l *keyList) push(k *keyState) {
	k.list = l
	k.wprev, k.wnext = l.tail, nil
	if l.tail != nil {
		l.tail.wnext = k
	} else {
		l.head = k
	}
	l.tail = k
	l.n++
}

func (l *keyList) remove(k *keyState) {
	if k.wprev != nil {
		k.wprev.wnext = k.wnext
	} else {
		l.head = k.wnext
	}
	if k.wnext != nil {
		k.wnext.wprev = k.wprev
	} else {
		l.tail = k.wprev
	}
	k.wprev, k.wnext, k.list = nil, nil, nil
	l.n--
}

func (l *keyList) pop() *keyState {
	k := l.head
	if k != nil {
		l.remove(k)
	}
	return k
}

// offsetList links all window entries in ascending offset order. Entries
// arrive in ascending order, so appending keeps it sorted, and its head is
// the lowest unresolved offset: the safe cursor is head.offset-1.
type offsetList struct{ head, tail *entry }

func (l *offsetList) push(e *entry) {
	e.oprev, e.onext = l.tail, nil
	if l.tail != nil {
		l.tail.onext = e
	} else {
		l.head = e
	}
	l.tail = e
}

func (l *offsetList) remove(e *entry) {
	if e.oprev != nil {
		e.oprev.onext = e.onext
	} else {
		l.head = e.onext
	}
	if e.onext != nil {
		e.onext.oprev = e.oprev
	} else {
		l.tail = e.oprev
	}
	e.oprev, e.onext = nil, nil
}

// deadlineList links in-flight entries in dispatch order. The ack timeout is
// the same for all, so this is also deadline order and the heartbeat only
// looks at its head.
type deadlineList struct{ head, tail *entry }

func (l *deadlineList) push(e *entry) {
	e.dprev, e.dnext = l.tail, nil
	if l.tail != nil {
		l.tail.dnext = e
	} else {
		l.head = e
	}
	l.tail = e
}

func (l *deadlineList) remove(e *entry) {
	if e.dprev != nil {
		e.dprev.dnext = e.dnext
	} else {
		l.head = e.dnext
	}
	if e.dnext != nil {
		e.dnext.dprev = e.dprev
	} else {
		l.tail = e.dprev
	}
	e.dprev, e.dnext = nil, nil
}

// memberList links the entries in flight on one member, so that losing the
// member touches only its own entries.
type memberList struct {
	head *entry
}

func (l *memberList) push(e *entry) {
	e.mprev, e.mnext = nil, l.head
	if l.head != nil {
		l.head.mprev = e
	}
	l.head = e
}

func (l *memberList) remove(e *entry) {
	if e.mprev != nil {
		e.mprev.mnext = e.mnext
	} else {
		l.head = e.mnext
	}
	if e.mnext != nil {
		e.mnext.mprev = e.mprev
	}
	e.mprev, e.mnext = nil, nil
}

// retryHeap orders entries waiting for a retry by retryAt (then offset, so
// the order is deterministic).
type retryHeap []*entry

func (h retryHeap) Len() int { return len(h) }
func (h retryHeap) Less(i, j int) bool {
	if !h[i].retryAt.Equal(h[j].retryAt) {
		return h[i].retryAt.Before(h[j].retryAt)
	}
	return h[i].msg.Offset < h[j].msg.Offset
}
func (h retryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *retryHeap) Push(x any) {
	e := x.(*entry)
	e.heapIdx = len(*h)
	*h = append(*h, e)
}
func (h *retryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.heapIdx = -1
	return e
}

func (h *retryHeap) push(e *entry)   { heap.Push(h, e) }
func (h *retryHeap) remove(e *entry) { heap.Remove(h, e.heapIdx) }

// peek returns the entry due first, or nil.
func (h retryHeap) peek() *entry {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}

// window holds every message read from the log and not yet resolved. Its
// operations touch only the entries and keys concerned: nothing scans it.
type window struct {
	// byOffset finds an entry by offset for acks. Every entry of the window is
	// in it exactly once.
	byOffset offsetIndex
	// keys holds the queue of every key with messages in the window. A key's
	// queue is in log order and only its head is ever delivered, retried or
	// requeued, so its messages go out in log order (invariant 2) and at most
	// one of them is in flight (invariant 1).
	keys map[string]*keyState
	// order is every entry in ascending offset order; order.head is the lowest
	// unresolved offset, which the cursor must stay below (invariant 3).
	order     offsetList
	deadlines deadlineList
	retries   retryHeap

	// count is the number of entries (in flight plus blocked); bytes is
	// everything the window keeps: the entries' size (Message.Size) plus
	// keyCost of every key in keys, idle ones included. The dispatcher reads
	// from the log only while count < Config.Window and bytes <
	// Config.WindowBytes, and idle keys leave first when bytes is over.
	count    int
	bytes    int64
	inflight int
	// stalledKeys counts keys with messages in the window but none in flight.
	stalledKeys int
	// poisoned counts keys stopped by PoisonBlock.
	poisoned int

	// idle holds keys whose queue emptied, oldest first, still in keys: a
	// key that comes back soon (as device ids do) then costs no map insert
	// and delete, which a map under steady churn pays dearly for. At most
	// idleMax are kept, costing at most idleBytesMax (a quarter of the
	// window's bytes); idleBytes is their keyCost.
	idle         keyList
	idleMax      int
	idleBytes    int64
	idleBytesMax int64
	// unordered makes every message its own queue (Config.Unordered): its
	// queue key is its offset, never reused, so no idle key is kept.
	unordered bool

	freeEntries *entry
	freeKeys    *keyState
}

func newWindow(idleKeys int, maxBytes int64, unordered bool) window {
	if unordered {
		idleKeys = 0
	}
	return window{
		byOffset:     offsetIndex{chunks: make(map[uint64]*offsetChunk)},
		keys:         make(map[string]*keyState),
		idleMax:      idleKeys,
		idleBytesMax: maxBytes / 4,
		unordered:    unordered,
	}
}

// queueKey is the queue m belongs to: its routing key, or, unordered, a
// name of its own (U+0000 and the offset: no MQTT string holds U+0000).
func (w *window) queueKey(m *Message) string {
	if w.unordered {
		return "\x00" + strconv.FormatUint(m.Offset, 10)
	}
	return m.Key
}

// keyStateOverhead is what a key costs besides its bytes: its keyState and
// its entry in the keys map.
const keyStateOverhead = 128

// keyCost is what the window counts for a key it keeps.
func keyCost(key string) int64 { return keyStateOverhead + int64(len(key)) }

// add appends m to the window and its key's queue. It reports whether m is
// now the head of its key (the key had no other message in the window).
func (w *window) add(m *Message) (*entry, bool) {
	e := w.freeEntries
	if e != nil {
		w.freeEntries = e.knext
		e.knext = nil
	} else {
		e = &entry{heapIdx: -1}
	}
	e.msg = *m
	key := w.queueKey(m)
	ks := w.keys[key]
	if ks != nil && ks.head == nil {
		w.idle.remove(ks)
		w.idleBytes -= keyCost(ks.key)
	}
	if ks == nil {
		ks = w.freeKeys
		if ks != nil {
			w.freeKeys = ks.wnext
			ks.wnext = nil
		} else {
			ks = &keyState{}
		}
		ks.key = key
		w.keys[key] = ks
		w.bytes += keyCost(ks.key)
	}
	e.ks = ks
	if ks.tail != nil {
		ks.tail.knext = e
	} else {
		ks.head = e
	}
	ks.tail = e
	ks.n++
	w.order.push(e)
	w.byOffset.put(m.Offset, e)
	w.count++
	w.bytes += int64(m.Size())
	w.markKey(ks)
	return e, ks.head == e
}

// removeHead takes e, the head of its key and not in flight, out of the
// window, and frees it. The key's queue is left with its next message (which
// the caller routes) or empty (the caller releases it with releaseKey).
func (w *window) removeHead(e *entry) {
	ks := e.ks
	ks.head = e.knext
	if ks.head == nil {
		ks.tail = nil
	}
	ks.n--
	w.order.remove(e)
	w.byOffset.del(e.msg.Offset)
	w.count--
	w.bytes -= int64(e.msg.Size())
	w.markKey(ks)
	*e = entry{heapIdx: -1, knext: w.freeEntries}
	w.freeEntries = e
}

// releaseKey parks ks, whose queue is empty, on the idle list, and forgets
// the oldest idle keys while there are too many or they cost too much.
func (w *window) releaseKey(ks *keyState) {
	if ks.list == &w.idle {
		return
	}
	w.idle.push(ks)
	w.idleBytes += keyCost(ks.key)
	for w.idle.n > w.idleMax || (w.idleBytes > w.idleBytesMax && w.idle.n > 0) {
		w.forgetIdle()
	}
}

// forgetIdle forgets the oldest idle key.
func (w *window) forgetIdle() {
	old := w.idle.pop()
	delete(w.keys, old.key)
	c := keyCost(old.key)
	w.idleBytes -= c
	w.bytes -= c
	*old = keyState{wnext: w.freeKeys}
	w.freeKeys = old
}

// makeRoom forgets idle keys, oldest first, until the window holds less than
// limit bytes or no key is idle: idle keys never keep the dispatcher from
// reading.
func (w *window) makeRoom(limit int64) {
	for w.bytes >= limit && w.idle.n > 0 {
		w.forgetIdle()
	}
}

// markKey recomputes whether ks counts as stalled (messages, none in flight).
func (w *window) markKey(ks *keyState) {
	stalled := ks.head != nil && ks.head.state != entryInflight
	if stalled != ks.stalled {
		ks.stalled = stalled
		if stalled {
			w.stalledKeys++
		} else {
			w.stalledKeys--
		}
	}
}

// offsetIndex maps offsets to window entries. Offsets are read in ascending
// order and resolved roughly so, which turns a plain map into a sliding
// window of inserts and deletes, a worst case for its probing. Instead the
// index keeps fixed arrays of 1<<chunkBits slots, one per offset range that
// has entries, found through a small map by range (one map insert and delete
// per 256 offsets) and a cache of the range used last.
type offsetIndex struct {
	chunks map[uint64]*offsetChunk
	n      int
	lastID uint64
	last   *offsetChunk
	spare  []*offsetChunk // freed chunks kept for reuse
}

const chunkBits = 8

type offsetChunk struct {
	n int
	e [1 << chunkBits]*entry
}

func (x *offsetIndex) chunk(id uint64) *offsetChunk {
	if x.last != nil && x.lastID == id {
		return x.last
	}
	ch := x.chunks[id]
	if ch != nil {
		x.last, x.lastID = ch, id
	}
	return ch
}

func (x *offsetIndex) get(off uint64) *entry {
	ch := x.chunk(off >> chunkBits)
	if ch == nil {
		return nil
	}
	return ch.e[off&(1<<chunkBits-1)]
}

func (x *offsetIndex) put(off uint64, e *entry) {
	id := off >> chunkBits
	ch := x.chunk(id)
	if ch == nil {
		if k := len(x.spare); k > 0 {
			ch = x.spare[k-1]
			x.spare = x.spare[:k-1]
		} else {
			ch = new(offsetChunk)
		}
		x.chunks[id] = ch
		x.last, x.lastID = ch, id
	}
	slot := &ch.e[off&(1<<chunkBits-1)]
	if *slot == nil {
		ch.n++
		x.n++
	}
	*slot = e
}

func (x *offsetIndex) del(off uint64) {
	id := off >> chunkBits
	ch := x.chunk(id)
	if ch == nil {
		return
	}
	slot := &ch.e[off&(1<<chunkBits-1)]
	if *slot == nil {
		return
	}
	*slot = nil
	ch.n--
	x.n--
	if ch.n == 0 {
		delete(x.chunks, id)
		if x.last == ch {
			x.last = nil
		}
		if len(x.spare) < 16 {
			x.spare = append(x.spare, ch)
		}
	}
}
