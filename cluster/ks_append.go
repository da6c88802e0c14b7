package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/keyline-mq/keyline/keyshared"
)

// appender appends publishes to group logs without making the publisher
// wait. Per group, the appends this node has waiting go to the stream
// together, as JetStream atomic batches (every message keeps its own
// Nats-Msg-Id and its own stream sequence: a batch is stored whole, in
// order, with consecutive sequences, or not at all), up to
// maxBatchesInFlight of them per group in flight from this node. Pipelined
// retries can land behind later messages (research section 4), so a key
// is in one batch in flight at most: its appends made meanwhile wait for
// the next batch after that one ends (the rule of one append per key in
// flight, with the key's waiting appends going together). A batch that
// fails in any way (an election, a full backlog, a server without atomic
// batches) is stored again message by message, in order, each retried
// through a leader election until the publish deadline under its id: a
// message the batch did store is then answered as a duplicate with its
// sequence, and a batch whose commit comes late finds a message already
// stored and is refused whole. A batch of one is a plain publish.
//
// The profile showed why (issue 24, ks-group on three nodes): one
// asynchronous JetStream publish per message, each its own Raft proposal,
// PubAck, reply subject, future, goroutine and timer, on a 2-core machine
// with no CPU to spare. With one batch in flight per group the batches'
// round trips (40-150 ms under that load, 200-300 messages each) bounded
// the group instead.
type appender struct {
	g    *Groups
	boot string // makes this run's message ids unique
	seq  atomic.Uint64

	mu struct {
		sync.Mutex
		groups  map[string]*groupAppends // group hash -> appends waiting and in flight
		noBatch map[string]time.Time     // group hash -> until when its stream takes no atomic batch
		closed  bool
	}
	pending sync.WaitGroup // appends submitted and not completed
	stop    chan struct{}
	ctx     context.Context // ends with stop
	cancel  context.CancelFunc
}

// groupAppends is a group's appends: those waiting, in the order made, the
// keys in a batch in flight, and how many batches are in flight.
type groupAppends struct {
	queue    []*appendReq
	keys     map[string]bool
	inFlight int
}

type appendReq struct {
	gh, key, id string
	data        []byte
	deadline    time.Time
	done        func(seq uint64, err error)
}

// maxBatchesInFlight bounds a group's batches in flight from a node. A
// batch of one is a plain publish, so under light load appends go one by
// one, pipelined as before; 4 held a publisher waiting on each PUBACK
// (BenchmarkClusterKeyShared, 16 in flight a node) behind batches of 2-4.
// nats-server takes 50 atomic batches in flight per stream and 1,000 per
// server: more are refused, and then stored message by message.
const maxBatchesInFlight = 16

// Bounds of one atomic batch: nats-server takes at most 1,000 messages
// (max_batch_size); the bytes keep a batch's staging on the stream leader small.
const (
	maxAppendBatch      = 500
	maxAppendBatchBytes = 4 << 20
)

// Headers of an atomic batch publish (nats-server 2.12+, ADR-50).
const (
	hdrBatchID     = "Nats-Batch-Id"
	hdrBatchSeq    = "Nats-Batch-Sequence"
	hdrBatchCommit = "Nats-Batch-Commit"
)

// errNoAtomicBatches: the server answered a batch's commit as a plain
// publish (nats-server before 2.12).
var errNoAtomicBatches = errors.New("cluster: the NATS server does not know atomic batches")

// errAtomicDisabled is nats-server's "atomic publish is disabled" (the
// stream was made without AllowAtomicPublish, by an older Keyline).
const errAtomicDisabled = 10174

func newAppender(g *Groups) *appender {
	a := &appender{g: g, boot: nuid.Next(), stop: make(chan struct{})}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.mu.groups = map[string]*groupAppends{}
	a.mu.noBatch = map[string]time.Time{}
	return a
}

// append adds data (an encoded message with routing key key) to group gh's
// log and calls done once with its offset or the error. id, when set, is
// the message id (a retried replay must not store twice).
func (a *appender) append(gh, key, id string, data []byte, done func(uint64, error)) {
	if id == "" {
		id = a.g.node.cfg.NodeID + "-" + a.boot + "-" + strconv.FormatUint(a.seq.Add(1), 36)
	}
	r := &appendReq{gh: gh, key: key, id: id, data: data, deadline: time.Now().Add(a.g.node.cfg.PublishTimeout), done: done}
	a.mu.Lock()
	if a.mu.closed {
		a.mu.Unlock()
		done(0, ErrNotReady)
		return
	}
	a.pending.Add(1)
	q := a.mu.groups[gh]
	if q == nil {
		q = &groupAppends{keys: map[string]bool{}}
		a.mu.groups[gh] = q
	}
	q.queue = append(q.queue, r)
	batch, batched := a.nextLocked(gh, q)
	a.mu.Unlock()
	if batch != nil {
		go a.run(gh, q, batch, batched)
	}
}

// nextLocked takes group gh's next batch if one may start: the waiting
// appends of every key not in a batch in flight, in the order made, within
// the batch's bounds. batched tells whether it goes as an atomic batch.
func (a *appender) nextLocked(gh string, q *groupAppends) (batch []*appendReq, batched bool) {
	if q.inFlight >= maxBatchesInFlight || len(q.queue) == 0 {
		return nil, false
	}
	size := 0
	kept := q.queue[:0]
	taken := map[string]bool{} // keys in this batch
	held := map[string]bool{}  // keys with an append this batch had no room for
	for _, r := range q.queue {
		switch {
		case held[r.key]: // behind an append of its key that did not fit
		case q.keys[r.key] && !taken[r.key]: // its key is in a batch in flight
		case len(batch) >= maxAppendBatch || len(batch) > 0 && size+len(r.data) > maxAppendBatchBytes:
			held[r.key] = true
		default:
			batch = append(batch, r)
			size += len(r.data)
			q.keys[r.key], taken[r.key] = true, true
			continue
		}
		kept = append(kept, r)
	}
	clear(q.queue[len(kept):])
	q.queue = kept
	if len(batch) == 0 {
		return nil, false
	}
	q.inFlight++
	batched = len(batch) > 1
	if until, ok := a.mu.noBatch[gh]; ok {
		if time.Now().Before(until) {
			batched = false
		} else {
			delete(a.mu.noBatch, gh)
		}
	}
	return batch, batched
}

// run stores batch, answers its appends, and starts the batches its end
// lets start.
func (a *appender) run(gh string, q *groupAppends, batch []*appendReq, batched bool) {
	for batch != nil {
		var seqs []uint64
		if batched {
			var err error
			if seqs, err = a.publishBatch(gh, batch); err != nil {
				seqs = nil
				a.batchFailed(gh, err)
			}
		}
		for i, r := range batch {
			var seq uint64
			var err error
			if seqs != nil {
				seq = seqs[i]
			} else {
				seq, err = a.publish(r)
			}
			r.done(seq, err)
			a.pending.Done()
		}
		a.mu.Lock()
		q.inFlight--
		for _, r := range batch {
			delete(q.keys, r.key)
		}
		batch, batched = a.nextLocked(gh, q)
		for {
			more, mb := a.nextLocked(gh, q)
			if more == nil {
				break
			}
			go a.run(gh, q, more, mb)
		}
		if batch == nil && q.inFlight == 0 && len(q.queue) == 0 {
			delete(a.mu.groups, gh)
		}
		a.mu.Unlock()
	}
}

// publishBatch stores batch as one atomic batch and returns the messages'
// sequences.
func (a *appender) publishBatch(gh string, batch []*appendReq) ([]uint64, error) {
	nc := a.g.node.nc
	id := nuid.Next()
	subj := groupSubject(gh)
	for i, r := range batch {
		m := &nats.Msg{Subject: subj, Data: r.data, Header: nats.Header{
			jetstream.MsgIDHeader: []string{r.id},
			hdrBatchID:            []string{id},
			hdrBatchSeq:           []string{strconv.Itoa(i + 1)},
		}}
		if i < len(batch)-1 {
			if err := nc.PublishMsg(m); err != nil {
				return nil, err
			}
			continue
		}
		m.Header[hdrBatchCommit] = []string{"1"}
		m.Header[jetstream.ExpectedStreamHeader] = []string{groupStream(gh)}
		ctx, cancel := context.WithTimeout(a.ctx, a.g.node.cfg.RequestTimeout)
		resp, err := nc.RequestMsgWithContext(ctx, m)
		cancel()
		if err != nil {
			return nil, err
		}
		var ack batchAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return nil, fmt.Errorf("cluster: group log batch: %w", err)
		}
		if ack.Error != nil {
			return nil, ack.Error
		}
		if ack.Batch == "" {
			// A server that does not know atomic batches stored them one by
			// one: the message ids give their sequences.
			return nil, errNoAtomicBatches
		}
		if ack.Batch != id || ack.Count != uint64(len(batch)) || ack.Seq < ack.Count {
			return nil, fmt.Errorf("cluster: group log batch: answered as batch %q of %d at %d", ack.Batch, ack.Count, ack.Seq)
		}
		a.g.node.lastJSOK.Store(time.Now().UnixNano())
		seqs := make([]uint64, len(batch))
		for i := range seqs {
			seqs[i] = ack.Seq - ack.Count + 1 + uint64(i)
		}
		return seqs, nil
	}
	return nil, errors.New("cluster: empty batch")
}

// batchAck is a stream's answer to a batch's commit.
type batchAck struct {
	Seq   uint64              `json:"seq"`
	Batch string              `json:"batch"`
	Count uint64              `json:"count"`
	Error *jetstream.APIError `json:"error"`
}

// batchFailed notes a failed batch: a stream that takes no atomic batch
// gets it (updated in the background) and is sent messages one by one
// meanwhile (30 s), as is one on a server that does not know them.
func (a *appender) batchFailed(gh string, err error) {
	var apiErr *jetstream.APIError
	disabled := errors.As(err, &apiErr) && apiErr.ErrorCode == errAtomicDisabled
	if !disabled && !errors.Is(err, errNoAtomicBatches) {
		return
	}
	a.mu.Lock()
	a.mu.noBatch[gh] = time.Now().Add(30 * time.Second)
	a.mu.Unlock()
	if !disabled {
		return
	}
	a.g.goFunc(func() {
		ctx, cancel := a.g.ctx()
		defer cancel()
		s, err := a.g.node.js.Stream(ctx, groupStream(gh))
		if err == nil {
			cfg := s.CachedInfo().Config
			cfg.AllowAtomicPublish = true
			_, err = a.g.node.js.UpdateStream(ctx, cfg)
		}
		if err != nil {
			a.g.log.Debug("key-shared: group log not switched to atomic batches", "stream", groupStream(gh), "error", err)
			return
		}
		a.mu.Lock()
		delete(a.mu.noBatch, gh)
		a.mu.Unlock()
	})
}

// publish stores r, retrying until its deadline.
func (a *appender) publish(r *appendReq) (uint64, error) {
	for attempt := 0; ; attempt++ {
		// A fresh message each attempt: nats.go writes the publish options
		// into the message's header and keeps the message for its own
		// retries of a future that may still be running when this loop
		// gives up on it (the race detector saw the two meet in
		// TestBackend/Committed). The id header dedupes a late first store.
		m := &nats.Msg{Subject: groupSubject(r.gh), Data: r.data, Header: nats.Header{jetstream.MsgIDHeader: []string{r.id}}}
		fut, err := a.g.node.js.PublishMsgAsync(m, jetstream.WithExpectStream(groupStream(r.gh)))
		if err == nil {
			t := time.NewTimer(a.g.node.cfg.RequestTimeout)
			select {
			case ack := <-fut.Ok():
				t.Stop()
				a.g.node.lastJSOK.Store(time.Now().UnixNano())
				return ack.Sequence, nil
			case err = <-fut.Err():
				t.Stop()
			case <-t.C:
				err = nats.ErrTimeout
			case <-a.stop:
				t.Stop()
				return 0, ErrNotReady
			}
		}
		if perr := appendRefusal(err); perr != nil {
			return 0, perr
		}
		if time.Now().After(r.deadline) {
			return 0, fmt.Errorf("cluster: group log append: %w (%v)", ErrNotReady, err)
		}
		if !sleepOr(a.stop, backoff(attempt)) {
			return 0, ErrNotReady
		}
	}
}

// appendRefusal maps the errors retrying cannot cure: a full backlog
// (DiscardNew limits) and a message too large.
func appendRefusal(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.ErrorCode == 10077 && strings.Contains(apiErr.Description, "maximum"):
			return fmt.Errorf("%w: %s", keyshared.ErrBacklogFull, apiErr.Description)
		case apiErr.ErrorCode == 10054:
			return fmt.Errorf("%w: %s", keyshared.ErrBacklogFull, apiErr.Description)
		case apiErr.ErrorCode == 10060: // stream not found (expected stream): the group was deleted
			return fmt.Errorf("%w: %s", keyshared.ErrGroupNotFound, apiErr.Description)
		}
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: %v", keyshared.ErrBacklogFull, err)
	}
	return nil
}

// flush waits for every append submitted so far.
func (a *appender) flush() { a.pending.Wait() }

func (a *appender) close() {
	a.mu.Lock()
	if a.mu.closed {
		a.mu.Unlock()
		return
	}
	a.mu.closed = true
	a.mu.Unlock()
	close(a.stop)
	a.cancel()
	a.pending.Wait()
}
