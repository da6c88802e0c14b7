package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/keyshared"
)

// groupLog is the keyshared.Log of a group on the node holding its lease:
// messages come from the group's stream KL_G_<hash> through an ordered
// consumer (one replica, in memory; nats.go recreates it after a gap or a
// NATS failure) into a bounded buffer; resolutions go into the state the
// holder replicates; dead letters into the stream KL_DLQ.
//
// The dispatcher calls ReadFrom, Head, LoadCursor, Resolve and DeadLetter
// from its goroutine; the reader goroutine fills the buffer; the holder's
// flusher snapshots the state. mu guards what they share.
type groupLog struct {
	g     *Groups
	gh    string
	name  string
	lease *lease
	adopt *adoptions

	head atomic.Uint64 // last offset the stream held, as last seen
	open atomic.Bool   // false until the takeover's resync is done: reads nothing

	mu struct {
		sync.Mutex
		st    groupState
		dirty bool
		buf   []keyshared.Message // read ahead, ascending offsets
		last  uint64              // highest offset the reader has seen
		// pendingDL: KL_DLQ sequences of dead letters written whose
		// offset is not resolved yet (their dlqSeq may not pass them).
		pendingDL map[uint64]uint64 // offset -> KL_DLQ sequence
		maxDL     uint64
	}
	room chan struct{} // the reader waits on it while the buffer is full
	stop chan struct{}
	wg   sync.WaitGroup
}

// maxReadAhead bounds the messages the reader holds for the dispatcher.
const maxReadAhead = 4096

var _ keyshared.Log = (*groupLog)(nil)

func newGroupLog(g *Groups, name, gh string, l *lease, st groupState, adopt *adoptions) *groupLog {
	lg := &groupLog{g: g, gh: gh, name: name, lease: l, adopt: adopt, room: make(chan struct{}, 1), stop: make(chan struct{})}
	lg.mu.st = st
	lg.mu.last = st.cursor
	lg.mu.pendingDL = map[uint64]uint64{}
	lg.mu.maxDL = st.dlqSeq
	return lg
}

// start runs the reader from just after the cursor.
func (l *groupLog) start() {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.read()
	}()
}

func (l *groupLog) close() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

func (l *groupLog) read() {
	for attempt := 0; ; attempt++ {
		l.mu.Lock()
		from := l.mu.last + 1
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), l.g.node.cfg.RequestTimeout)
		cons, err := l.g.node.orderedConsumer(ctx, groupStream(l.gh), jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from, InactiveThreshold: 30 * time.Second,
		})
		cancel()
		var it jetstream.MessagesContext
		if err == nil {
			it, err = cons.Messages(pullOpts(512)...)
		}
		if err != nil {
			l.g.log.Warn("key-shared group log: consumer not created; retrying", "group", l.name, "error", err)
			if !sleepOr(l.stop, backoff(attempt)) {
				return
			}
			continue
		}
		attempt = 0
		done := make(chan struct{})
		go func() {
			select {
			case <-l.stop:
				it.Stop()
			case <-done:
			}
		}()
		l.consume(it)
		close(done)
		it.Stop()
		select {
		case <-l.stop:
			return
		default:
		}
	}
}

// consume moves messages from the iterator into the buffer until it ends.
func (l *groupLog) consume(it jetstream.MessagesContext) {
	for {
		m, err := it.Next()
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				l.g.log.Warn("key-shared group log: reading ended; reopening", "group", l.name, "error", err)
			}
			return
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		seq := md.Sequence.Stream
		l.head.Store(max(l.head.Load(), seq+md.NumPending))
		msg, derr := keyshared.DecodeMessage(m.Data(), true)
		msg.Offset = seq
		for {
			l.mu.Lock()
			if len(l.mu.buf) < maxReadAhead {
				break
			}
			l.mu.Unlock()
			select {
			case <-l.room:
			case <-l.stop:
				return
			}
		}
		if seq <= l.mu.last {
			l.mu.Unlock()
			continue
		}
		// Offsets skipped by the stream were dropped by its limits
		// (drop-oldest) or trimmed below the cursor: resolved either way.
		if gap := l.mu.last + 1; gap < seq {
			l.resolveRangeLocked(gap, seq-1, true)
		}
		l.mu.last = seq
		if derr != nil {
			l.g.log.Error("key-shared group log: undecodable message skipped", "group", l.name, "offset", seq, "error", derr)
			l.resolveRangeLocked(seq, seq, false)
		} else {
			l.mu.buf = append(l.mu.buf, msg)
		}
		l.mu.Unlock()
		if l.open.Load() {
			l.g.notify(l.gh)
		}
	}
}

// resolveRangeLocked marks a..b resolved (dropped: counted as dropped when
// they were not resolved before).
func (l *groupLog) resolveRangeLocked(a, b uint64, dropped bool) {
	st := &l.mu.st
	a = max(a, st.cursor+1)
	if a > b {
		return
	}
	if dropped {
		n := b - a + 1
		for _, r := range st.resolved.r {
			lo, hi := max(r[0], a), min(r[1], b)
			if lo <= hi {
				n -= hi - lo + 1
			}
		}
		st.dropped += n
	}
	st.resolved.add(a, b)
	l.advanceLocked()
}

func (l *groupLog) advanceLocked() {
	st := &l.mu.st
	if len(st.resolved.r) > 0 && st.resolved.r[0][0] == st.cursor+1 {
		st.cursor = st.resolved.r[0][1]
		st.resolved.r = st.resolved.r[1:]
	}
	l.mu.dirty = true
}

// ReadFrom implements keyshared.Log.
func (l *groupLog) ReadFrom(from uint64, max int, out []keyshared.Message) ([]keyshared.Message, error) {
	if !l.open.Load() {
		return out, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	for i < len(l.mu.buf) && l.mu.buf[i].Offset < from {
		i++
	}
	if i > 0 {
		l.mu.buf = append(l.mu.buf[:0], l.mu.buf[i:]...)
		select {
		case l.room <- struct{}{}:
		default:
		}
	}
	st := &l.mu.st
	for j := 0; j < len(l.mu.buf) && max > 0; j++ {
		m := &l.mu.buf[j]
		if m.Offset <= st.cursor || st.resolved.contains(m.Offset) {
			continue
		}
		if l.adopt.resolvedByTakeover(m) {
			l.resolveRangeLocked(m.Offset, m.Offset, false)
			continue
		}
		out = append(out, *m)
		max--
	}
	return out, nil
}

// Head implements keyshared.Log.
func (l *groupLog) Head() uint64 {
	if !l.open.Load() {
		return 0
	}
	return l.head.Load()
}

// LoadCursor implements keyshared.Log.
func (l *groupLog) LoadCursor() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.st.cursor, nil
}

// Resolve implements keyshared.Log.
func (l *groupLog) Resolve(offs []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := &l.mu.st
	for _, o := range offs {
		if o > st.cursor {
			st.resolved.add(o, o)
		}
		delete(l.mu.pendingDL, o)
	}
	l.advanceLocked()
}

// DeadLetter implements keyshared.Log: the dead letter is in KL_DLQ (R3)
// before it returns. A holder whose lease may have lapsed refuses (the
// dispatcher tries again on its heartbeat).
func (l *groupLog) DeadLetter(d keyshared.DeadLetter) error {
	if !l.lease.valid() {
		return fmt.Errorf("cluster: group %s: %w", l.name, ErrLeaseLost)
	}
	d.Group = l.name
	id := "dl-" + l.gh + "-" + strconv.FormatUint(d.Message.Offset, 10)
	seq, err := l.g.storeDeadLetter(l.gh, keyshared.AppendDeadLetter(nil, &d), id)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.mu.pendingDL[d.Message.Offset] = seq
	l.mu.maxDL = max(l.mu.maxDL, seq)
	l.mu.Unlock()
	// Published live by this node's side of the group (every node opens
	// every group; one that has not yet is told through OnDeadLetter).
	if ng := l.g.nodeGroupOf(l.gh); ng != nil {
		ng.local.DeadLettered(d)
	} else if f := l.g.cfg.OnDeadLetter; f != nil {
		f(l.name, d)
	}
	return nil
}

// snapshot returns the state to write if it changed since the last one.
func (l *groupLog) snapshot(members int, lastSeen time.Time) (groupState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := &l.mu.st
	if !l.mu.dirty && st.members == members {
		return groupState{}, false
	}
	l.mu.dirty = false
	safe := l.mu.maxDL
	for _, seq := range l.mu.pendingDL {
		safe = min(safe, seq-1)
	}
	st.dlqSeq = max(st.dlqSeq, safe)
	st.members, st.lastSeen = members, lastSeen
	out := *st
	out.resolved.r = append([][2]uint64(nil), st.resolved.r...)
	return out, true
}

// markDirty makes the next snapshot write (after a failed write).
func (l *groupLog) markDirty() {
	l.mu.Lock()
	l.mu.dirty = true
	l.mu.Unlock()
}

// cursor returns the log's cursor.
func (l *groupLog) cursor() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.st.cursor
}

func sleepOr(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}
