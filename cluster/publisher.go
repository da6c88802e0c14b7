package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// How many QoS 1/2 stores may be in flight: per publisher (one client
// connection) and per node. A publisher past its bound, or past the node's,
// waits in Store (its connection's reader stops reading).
const (
	PublisherWindow = 64
	nodeWindow      = 1024
)

// A Publisher stores one client's QoS 1/2 messages in KL_MSGS with up to
// PublisherWindow of them in flight (asynchronous JetStream publishes), and
// hands their results back in the order they were given, on one goroutine:
// the publisher's acknowledgements and local deliveries follow its stores
// in its order.
//
// Order in the stream: a store is published once, without nats.go's own
// retry (which republishes a message after "no responders", behind any
// later message of the publisher already sent). A store that failed in a
// way a retry may cure (a timeout, no stream leader for a moment) is retried
// under its message id (a retry of a message that was stored after all is
// not stored twice) only if no later store of the publisher landed: the
// publisher's new stores wait, those already in flight are waited for, and
// if one of them was stored the failed one is refused instead, since its
// retry would land behind it. In an outage every store in flight fails, and
// they are retried one by one, in order.
type Publisher struct {
	n     *Node
	slots chan struct{} // PublisherWindow
	idle  func()        // see NewPublisher; may be nil

	mu       sync.Mutex
	cond     *sync.Cond // signalled when a retry ends
	q        []*pendingStore
	running  bool // the drain goroutine runs
	retrying bool // q[0] is being retried: no new store starts
}

type pendingStore struct {
	subj, id string
	body     []byte
	deadline time.Time
	fut      jetstream.PubAckFuture
	err      error // the async publish could not be started
	done     func(seq uint64, err error)

	awaited bool // the first answer is in (seq, aerr)
	seq     uint64
	aerr    error
}

// NewPublisher returns a Publisher for one client connection. idle, if
// not nil, is called on the result goroutine whenever it has handed back
// every result that is in and would wait for the next (or ends): JetStream
// answers a window of stores in bursts, and a caller that holds back its
// writes during a run of results (the publisher's acknowledgements) sends
// them together there.
func (n *Node) NewPublisher(idle func()) *Publisher {
	p := &Publisher{n: n, slots: make(chan struct{}, PublisherWindow), idle: idle}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Store starts storing a QoS 1/2 message published on topic; done is called
// once, on the publisher's result goroutine, with the stream sequence or
// the error (as Node.Publish's). Calls of done come in the order of the
// Stores. Store waits while the publisher's or the node's window is full.
func (p *Publisher) Store(topic string, body []byte, done func(seq uint64, err error)) {
	n := p.n
	select {
	case p.slots <- struct{}{}:
	case <-n.stop:
		p.refuse(done)
		return
	}
	select {
	case n.storeSlots <- struct{}{}:
	case <-n.stop:
		<-p.slots
		p.refuse(done)
		return
	}
	subj, _ := TopicSubject(KindQueued, topic)
	ps := &pendingStore{subj: subj, body: body, id: n.nextMsgID(), deadline: time.Now().Add(n.cfg.PublishTimeout), done: done}
	p.mu.Lock()
	for p.retrying {
		p.cond.Wait()
	}
	m := &nats.Msg{Subject: subj, Data: body, Header: nats.Header{hdrNode: []string{n.cfg.NodeID}}}
	ps.fut, ps.err = n.js.PublishMsgAsync(m, jetstream.WithMsgID(ps.id), jetstream.WithExpectStream(StreamMessages), jetstream.WithRetryAttempts(0))
	p.q = append(p.q, ps)
	for l := uint64(len(p.q)); ; {
		if m := n.Stats.StoreWindowMax.Load(); l <= m || n.Stats.StoreWindowMax.CompareAndSwap(m, l) {
			break
		}
	}
	if !p.running {
		p.running = true
		go p.drain() // ends when the queue is empty; every store ends by its deadline or the node's stop
	}
	p.mu.Unlock()
}

// refuse answers a store the stopping node does not start.
func (p *Publisher) refuse(done func(uint64, error)) {
	done(0, ErrNotReady)
	if p.idle != nil {
		p.idle()
	}
}

// drain hands the results back in order.
func (p *Publisher) drain() {
	for {
		p.mu.Lock()
		if len(p.q) == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		ps := p.q[0]
		p.mu.Unlock()
		seq, err := p.await(ps)
		if err != nil && !permanent(err) && !p.n.stopped() {
			seq, err = p.retry(ps, err)
		} else if err != nil {
			err = p.n.storeFailed(err)
		}
		if err == nil {
			p.n.lastJSOK.Store(time.Now().UnixNano())
			p.n.Stats.QueuedPublished.Add(1)
		}
		ps.done(seq, err)
		p.mu.Lock()
		p.q = p.q[1:]
		if p.retrying && (len(p.q) == 0 || !p.q[0].awaited || p.q[0].aerr == nil) {
			p.retrying = false // no failed store of the publisher is left to retry
			p.cond.Broadcast()
		}
		more := len(p.q) > 0 && p.stored(p.q[0])
		p.mu.Unlock()
		<-p.n.storeSlots
		<-p.slots
		if !more && p.idle != nil {
			p.idle()
		}
	}
}

// stored reports, without waiting, whether ps's answer is in and a
// success. Only the drain goroutine calls it.
func (p *Publisher) stored(ps *pendingStore) bool {
	if !ps.awaited && ps.err == nil {
		select {
		case ack := <-ps.fut.Ok():
			ps.seq, ps.aerr, ps.awaited = ack.Sequence, nil, true
		case err := <-ps.fut.Err():
			ps.seq, ps.aerr, ps.awaited = 0, err, true
		default:
		}
	}
	return ps.awaited && ps.aerr == nil
}

// await returns a store's first answer (waiting at most RequestTimeout).
// Only the drain goroutine calls it.
func (p *Publisher) await(ps *pendingStore) (uint64, error) {
	if !ps.awaited {
		ps.seq, ps.aerr = p.awaitFuture(ps)
		ps.awaited = true
	}
	return ps.seq, ps.aerr
}

func (p *Publisher) awaitFuture(ps *pendingStore) (uint64, error) {
	if ps.err != nil {
		return 0, ps.err
	}
	t := time.NewTimer(p.n.cfg.RequestTimeout)
	defer t.Stop()
	select {
	case ack := <-ps.fut.Ok():
		return ack.Sequence, nil
	case err := <-ps.fut.Err():
		return 0, err
	case <-t.C:
		return 0, nats.ErrTimeout
	case <-p.n.stop:
		return 0, ErrNotReady
	}
}

// retry stores ps, the oldest of the publisher's stores, again unless a
// later one landed (see Publisher). New stores wait until the retries end.
func (p *Publisher) retry(ps *pendingStore, first error) (uint64, error) {
	p.mu.Lock()
	p.retrying = true
	later := append([]*pendingStore(nil), p.q[1:]...)
	p.mu.Unlock()
	for _, l := range later {
		if _, err := p.await(l); err == nil {
			p.n.Stats.PublishErrors.Add(1)
			p.n.Stats.StoresNotRetried.Add(1)
			return 0, fmt.Errorf("cluster: store on %s: %w (%v; not retried: a later message of the publisher is stored)", StreamMessages, ErrNotReady, first)
		}
	}
	if !p.n.sleep(backoff(0)) {
		return 0, ErrNotReady
	}
	return p.n.storeWithID(context.Background(), ps.subj, ps.body, StreamMessages, ps.id, ps.deadline)
}

// storeFailed counts a store that is not retried and names it.
func (n *Node) storeFailed(err error) error {
	n.Stats.PublishErrors.Add(1)
	if permanent(err) {
		return fmt.Errorf("cluster: store on %s: %w", StreamMessages, err)
	}
	return fmt.Errorf("cluster: store on %s: %w (%v)", StreamMessages, ErrNotReady, err)
}
