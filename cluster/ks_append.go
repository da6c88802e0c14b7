package cluster

import (
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
// wait: each append is an asynchronous JetStream publish with its own
// Nats-Msg-Id, retried through a leader election until the publish
// deadline (the id makes a retry store once). Per group and routing key at
// most one append is in flight from this node, so a retried append never
// lands after a later message of its key (pipelined retries can reorder);
// different keys pipeline freely.
type appender struct {
	g    *Groups
	boot string // makes this run's message ids unique
	seq  atomic.Uint64

	mu struct {
		sync.Mutex
		keys   map[string][]*appendReq // group hash + key -> appends waiting (the first is in flight)
		closed bool
	}
	pending sync.WaitGroup // appends submitted and not completed
	stop    chan struct{}
}

type appendReq struct {
	gh, slot string
	msg      *nats.Msg
	deadline time.Time
	done     func(seq uint64, err error)
}

func newAppender(g *Groups) *appender {
	a := &appender{g: g, boot: nuid.Next(), stop: make(chan struct{})}
	a.mu.keys = map[string][]*appendReq{}
	return a
}

// append adds data (an encoded message with routing key key) to group gh's
// log and calls done once with its offset or the error. id, when set, is
// the message id (a retried replay must not store twice).
func (a *appender) append(gh, key, id string, data []byte, done func(uint64, error)) {
	if id == "" {
		id = a.g.node.cfg.NodeID + "-" + a.boot + "-" + strconv.FormatUint(a.seq.Add(1), 36)
	}
	m := &nats.Msg{Subject: groupSubject(gh), Data: data, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
	r := &appendReq{gh: gh, slot: gh + "\x00" + key, msg: m, deadline: time.Now().Add(a.g.node.cfg.PublishTimeout), done: done}
	a.mu.Lock()
	if a.mu.closed {
		a.mu.Unlock()
		done(0, ErrNotReady)
		return
	}
	a.pending.Add(1)
	q := a.mu.keys[r.slot]
	a.mu.keys[r.slot] = append(q, r)
	a.mu.Unlock()
	if len(q) == 0 {
		a.start(r)
	}
}

func (a *appender) start(r *appendReq) {
	go func() {
		seq, err := a.publish(r)
		r.done(seq, err)
		a.pending.Done()
		a.mu.Lock()
		q := a.mu.keys[r.slot][1:]
		if len(q) == 0 {
			delete(a.mu.keys, r.slot)
		} else {
			a.mu.keys[r.slot] = q
		}
		a.mu.Unlock()
		if len(q) > 0 {
			a.start(q[0])
		}
	}()
}

// publish stores r, retrying until its deadline.
func (a *appender) publish(r *appendReq) (uint64, error) {
	for attempt := 0; ; attempt++ {
		// A fresh message each attempt: nats.go writes the publish options
		// into the message's header and keeps the message for its own
		// retries of a future that may still be running when this loop
		// gives up on it (the race detector saw the two meet in
		// TestBackend/Committed). The id header dedupes a late first store.
		m := &nats.Msg{Subject: r.msg.Subject, Data: r.msg.Data, Header: nats.Header{}}
		for k, v := range r.msg.Header {
			m.Header[k] = append([]string(nil), v...)
		}
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
	a.pending.Wait()
}
