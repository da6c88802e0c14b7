package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// How a node's ordered consumers pull: every pull request expires after
// pullExpiry, and the server sends an idle heartbeat every pullHeartbeat; an
// ordered consumer that misses two recreates itself from the last message it
// delivered. A pull request can be lost: one sent right after its consumer was
// created can reach the NATS server before that server learns, over a route,
// of the consumer (measured: a node's consumer made on an interest change got
// nothing until nats.go's default check, 2 x 5 s, reset it). The short
// heartbeat bounds that stall to about 2 s.
const (
	pullExpiry    = 5 * time.Second
	pullHeartbeat = time.Second
)

// orderedConsumer makes the ordered consumer every reader of the node uses.
// nats.go recreates an ordered consumer after missed heartbeats, by default
// retrying forever, every try under the same consumer name. When the NATS
// server the cluster placed that consumer on (an R1 consumer has one) is
// dead, every try waits 10 s for an answer that never comes while Next
// returns nothing: a group log stopped for good after its stream leader was
// SIGKILLed (TestClusterKeySharedNATSServerKilled, 1 run in 3), with the
// consumer listed on the dead server. One try per recovery instead: when it
// fails, Next returns the error and the reader makes a new ordered consumer
// (a new name, placed anew) from the last message it handled.
func (n *Node) orderedConsumer(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	cfg.MaxResetAttempts = 1
	return n.js.OrderedConsumer(ctx, stream, cfg)
}

// pullOpts are the options of every ordered consumer's Messages.
func pullOpts(max int) []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(max), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat)}
}

func backoff(attempt int) time.Duration {
	d := 50 * time.Millisecond << min(attempt, 5)
	return min(d, time.Second)
}

// Publish sends a message published on this node to the other nodes. QoS 0
// goes over core NATS (no wait, at most once); QoS 1 and 2 are stored in
// KL_MSGS first, and Publish returns the stream sequence once the store is
// acknowledged (retrying through a JetStream leader election, with one
// message id, so a retry never stores twice).
func (n *Node) Publish(ctx context.Context, topic string, qos byte, body []byte) (uint64, error) {
	if qos == 0 {
		subj, _ := TopicSubject(KindMessage, topic)
		if err := n.nc.Publish(subj, body); err != nil {
			n.Stats.PublishErrors.Add(1)
			return 0, fmt.Errorf("cluster: publish: %w", err)
		}
		n.Stats.CorePublished.Add(1)
		return 0, nil
	}
	subj, _ := TopicSubject(KindQueued, topic)
	seq, err := n.store(ctx, subj, body, StreamMessages)
	if err != nil {
		return 0, err
	}
	n.Stats.QueuedPublished.Add(1)
	return seq, nil
}

// StoreRetained stores a retained message (the body says whether it is a
// delete) for every node, and returns once it is acknowledged.
func (n *Node) StoreRetained(ctx context.Context, topic string, body []byte) error {
	subj, _ := TopicSubject(KindRetained, topic)
	if _, err := n.store(ctx, subj, body, StreamRetained); err != nil {
		return err
	}
	n.Stats.RetainedStored.Add(1)
	return nil
}

func (n *Node) store(ctx context.Context, subj string, body []byte, stream string) (uint64, error) {
	return n.storeWithID(ctx, subj, body, stream, n.nextMsgID(), time.Now().Add(n.cfg.PublishTimeout))
}

// nextMsgID is the JetStream message id of a store: one per message, kept
// by its retries, so that a retry of a stored message does not store it twice.
func (n *Node) nextMsgID() string {
	return n.cfg.NodeID + "-" + n.boot + "-" + strconv.FormatUint(n.msgID.Add(1), 10)
}

// storeWithID stores a message under id, retrying until deadline.
func (n *Node) storeWithID(ctx context.Context, subj string, body []byte, stream, id string, deadline time.Time) (uint64, error) {
	for attempt := 0; ; attempt++ {
		// A fresh message each attempt: nats.go writes the publish options
		// into its header (and an async store that gave up may still hold it).
		m := &nats.Msg{Subject: subj, Data: body, Header: nats.Header{hdrNode: []string{n.cfg.NodeID}}}
		actx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
		ack, err := n.js.PublishMsg(actx, m, jetstream.WithMsgID(id), jetstream.WithExpectStream(stream))
		cancel()
		if err == nil {
			n.lastJSOK.Store(time.Now().UnixNano())
			return ack.Sequence, nil
		}
		if permanent(err) {
			n.Stats.PublishErrors.Add(1)
			return 0, fmt.Errorf("cluster: store on %s: %w", stream, err) // refused, not unavailable
		}
		if ctx.Err() != nil || time.Now().After(deadline) || n.stopped() {
			n.Stats.PublishErrors.Add(1)
			return 0, fmt.Errorf("cluster: store on %s: %w (%v)", stream, ErrNotReady, err)
		}
		if !n.sleep(backoff(attempt)) {
			return 0, ErrNotReady
		}
	}
}

// coreLoop hands core messages to the handler in the order the connection
// received them (every core subscription shares one channel).
func (n *Node) coreLoop() {
	for {
		select {
		case <-n.stop:
			return
		case m := <-n.coreCh:
			n.Stats.CoreReceived.Add(1)
			if n.h.Message != nil {
				n.h.Message(Incoming{Data: m.Data})
			}
		}
	}
}

func (n *Node) readQueued(it jetstream.MessagesContext) {
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || n.stopped() {
				return
			}
			n.log.Warn("reading queued messages", "error", err)
			return
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		seq := md.Sequence.Stream
		switch {
		case seq <= n.queuedPos.Load():
			n.Stats.QueuedRedeliver.Add(1)
		case m.Headers().Get(hdrNode) == n.cfg.NodeID:
			n.Stats.QueuedOwn.Add(1)
			n.queuedPos.Store(seq)
		default:
			n.Stats.QueuedReceived.Add(1)
			if n.h.Message != nil {
				n.h.Message(Incoming{Data: m.Data(), Seq: seq, Queued: true})
			}
			n.queuedPos.Store(seq)
		}
	}
}

// QueuedPosition returns the highest KL_MSGS sequence this node has handed
// to its handler (or skipped as its own).
func (n *Node) QueuedPosition() uint64 { return n.queuedPos.Load() }

// startRetained tails KL_RETAINED from the last message of every subject;
// retainedOK closes once the tail was reached. Nothing of a failed try is
// left running: Start tries again.
func (n *Node) startRetained(ctx context.Context) error {
	st, err := n.js.Stream(ctx, StreamRetained)
	if err != nil {
		return fmt.Errorf("retained stream: %w", err)
	}
	empty := st.CachedInfo().State.Msgs == 0
	it, err := n.retainedIterator(ctx, 0)
	if err != nil {
		return err
	}
	if !n.trackIterator(it) {
		return ErrNotReady
	}
	if empty {
		n.retainedLoaded()
	}
	n.goFunc(func() {
		for {
			n.readRetained(it)
			n.untrackIterator(it)
			it.Stop()
			// The consumer failed (see orderedConsumer): a new one from
			// the last message handled.
			for attempt := 0; ; attempt++ {
				if n.stopped() {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RequestTimeout)
				it, err = n.retainedIterator(ctx, n.retainedPos.Load())
				cancel()
				if err == nil {
					break
				}
				n.log.Warn("reading retained messages: consumer not created; retrying", "error", err, "attempt", attempt+1)
				if !n.sleep(backoff(attempt)) {
					return
				}
			}
			if !n.trackIterator(it) {
				return
			}
		}
	})
	return nil
}

// retainedIterator reads the retained stream after sequence after (0: all of
// it; one message per subject, the last).
func (n *Node) retainedIterator(ctx context.Context, after uint64) (jetstream.MessagesContext, error) {
	cfg := jetstream.OrderedConsumerConfig{
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		FilterSubjects: []string{Prefix + "." + KindRetained + ".>"},
	}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := n.orderedConsumer(ctx, StreamRetained, cfg)
	if err != nil {
		return nil, fmt.Errorf("retained consumer: %w", err)
	}
	it, err := cons.Messages(pullOpts(500)...)
	if err != nil {
		return nil, fmt.Errorf("retained consumer: %w", err)
	}
	return it, nil
}

// readRetained hands retained messages to the handler until the iterator ends.
func (n *Node) readRetained(it jetstream.MessagesContext) {
	for {
		m, err := it.Next()
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) && !n.stopped() {
				n.log.Warn("reading retained messages: consumer failed; reopening", "error", err)
			}
			return
		}
		n.Stats.RetainedReceived.Add(1)
		if n.h.Retained != nil {
			n.h.Retained(Incoming{Data: m.Data()})
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		n.retainedPos.Store(md.Sequence.Stream)
		if md.NumPending == 0 {
			n.retainedLoaded()
		}
	}
}

// retainedLoaded marks the retained stream as read up to its tail.
func (n *Node) retainedLoaded() { n.retainedOnce.Do(func() { close(n.retainedOK) }) }

// CatchUpRetained waits until every retained message stored anywhere in the
// cluster before the call has been handed to Handler.Retained, or ctx ends:
// a subscription made after a retained publish was acknowledged on another
// node gets it.
func (n *Node) CatchUpRetained(ctx context.Context) error {
	st, err := n.js.Stream(ctx, StreamRetained)
	if err != nil {
		return fmt.Errorf("cluster: retained stream: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("cluster: retained stream: %w", err)
	}
	for n.retainedPos.Load() < info.State.LastSeq {
		if info.State.Msgs == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: retained messages not caught up: %w", ctx.Err())
		case <-n.stop:
			return ErrNotReady
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// permanent reports whether a store error will not go away by retrying: a
// message too large for NATS or the stream. Everything else (timeouts, no
// responders, a stream without a leader for a moment, answers from a node
// that is catching up) is retried until the publish deadline.
func permanent(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10054 // message size exceeds maximum allowed
}
