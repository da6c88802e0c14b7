package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A group's lease is the key l.<group hash> of the bucket KL_GROUPS, with
// a per-message TTL (the bucket has LimitMarkerTTL, so the server removes
// an expired lease and leaves a marker watchers see). Its holder runs the
// group's one dispatcher:
//
//   - acquire: kv.Create with the TTL (succeeds only when the key is absent,
//     deleted or expired); the revision written is the holder's epoch;
//   - renew: a publish to the key's subject with the TTL and
//     Nats-Expected-Last-Subject-Sequence = the revision last written (never
//     kv.Update, which drops the TTL); the new revision is the fencing token;
//   - fencing: the holder's state writes go to s.<group hash> in the same
//     bucket with Nats-Expected-Last-Subject-Sequence-Subject = the lease's
//     subject, so the server refuses them once anyone else wrote the lease;
//     deliveries and dead letters, which the server cannot fence, stop when
//     the lease would lapse by the holder's own monotonic clock (the time it
//     sent its last successful renewal + TTL - margin), or at once when its
//     NATS connection drops, and resume only after a renewal succeeds;
//   - takeover of a dead holder's lease: another node writes over the
//     revision it saw, once the holder's node has been silent for
//     nodeSilent and NATS has no responder for it (a SIGKILLed process's
//     connection is gone at once);
//   - release (handover, shutdown): delete with the last revision, after the
//     final state write.

// ErrLeaseLost is returned by fenced writes once another node holds the lease.
var ErrLeaseLost = errors.New("cluster: group lease lost")

type leaseValue struct {
	Node  string `json:"node"`
	Epoch uint64 `json:"epoch,omitempty"` // the revision that acquired it (0 in that revision itself)
}

// leaseView is a lease as a watcher sees it.
type leaseView struct {
	node  string
	epoch uint64
	rev   uint64
}

func (g *Groups) leaseKey(gh string) string   { return "l." + gh }
func (g *Groups) stateKey(gh string) string   { return "s." + gh }
func (g *Groups) kvSubject(key string) string { return "$KV." + BucketGroups + "." + key }

// lease is a held lease. Its mutex serialises every write the server
// fences on it (renewals, state), so none is refused for another in flight.
type lease struct {
	g     *Groups
	gh    string
	epoch uint64
	base  time.Time // monotonic origin of deadline

	// deadline is when the holder must have stopped, in nanoseconds since
	// base; 0 while fenced (NATS connection lost since the last renewal).
	deadline atomic.Int64
	// connGen is the node's connection generation at the last renewal.
	connGen atomic.Uint64
	lost    atomic.Bool

	mu  sync.Mutex
	rev uint64 // last revision written (guarded by mu)
}

func (g *Groups) leaseValue(epoch uint64) []byte {
	b, _ := json.Marshal(leaseValue{Node: g.node.cfg.NodeID, Epoch: epoch})
	return b
}

// acquire creates the lease of gh, or writes over revision over (a dead
// holder's) when over > 0. It returns the held lease.
func (g *Groups) acquire(ctx context.Context, gh string, over uint64) (*lease, error) {
	sent := time.Now()
	gen := g.node.connGen.Load()
	var rev uint64
	var err error
	if over == 0 {
		rev, err = g.kv.Create(ctx, g.leaseKey(gh), g.leaseValue(0), jetstream.KeyTTL(g.cfg.LeaseTTL))
	} else {
		var ack *jetstream.PubAck
		ack, err = g.node.js.Publish(ctx, g.kvSubject(g.leaseKey(gh)), g.leaseValue(0),
			jetstream.WithExpectLastSequencePerSubject(over), jetstream.WithMsgTTL(g.cfg.LeaseTTL))
		if err == nil {
			rev = ack.Sequence
		}
	}
	if err != nil {
		return nil, err
	}
	l := &lease{g: g, gh: gh, epoch: rev, rev: rev, base: sent}
	l.connGen.Store(gen)
	l.extend(sent)
	return l, nil
}

// extend moves the deadline to sent + TTL - margin (sent: when the
// successful renewal was sent).
func (l *lease) extend(sent time.Time) {
	d := sent.Add(l.g.cfg.LeaseTTL - l.g.cfg.LeaseMargin).Sub(l.base)
	l.deadline.Store(max(int64(d), 1))
}

// valid reports whether the holder may deliver now: the lease is not lost,
// its deadline has not passed and the NATS connection has not dropped since
// the last renewal.
func (l *lease) valid() bool {
	if l.lost.Load() || l.connGen.Load() != l.g.node.connGen.Load() {
		return false
	}
	return int64(time.Since(l.base)) < l.deadline.Load()
}

// renew writes the lease again. ErrLeaseLost means someone else holds it;
// other errors (NATS unavailable) leave the lease as it was.
func (l *lease) renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost.Load() {
		return ErrLeaseLost
	}
	sent := time.Now()
	gen := l.g.node.connGen.Load()
	ack, err := l.g.node.js.Publish(ctx, l.g.kvSubject(l.g.leaseKey(l.gh)), l.g.leaseValue(l.epoch),
		jetstream.WithExpectLastSequencePerSubject(l.rev), jetstream.WithMsgTTL(l.g.cfg.LeaseTTL))
	if err != nil {
		return l.checkLost(err)
	}
	l.rev = ack.Sequence
	l.connGen.Store(gen)
	l.extend(sent)
	return nil
}

// checkLost turns a refused write into ErrLeaseLost. A "wrong last
// sequence" with the constant code (10164) means another write to the
// lease was in flight: someone is taking it, or about to; the next renewal
// tells.
func (l *lease) checkLost(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		l.lost.Store(true)
		return fmt.Errorf("%w: %v", ErrLeaseLost, err)
	}
	return err
}

// writeState writes the group's state record, fenced by the lease.
func (l *lease) writeState(ctx context.Context, data []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost.Load() {
		return ErrLeaseLost
	}
	_, err := l.g.node.js.Publish(ctx, l.g.kvSubject(l.g.stateKey(l.gh)), data,
		jetstream.WithExpectLastSequenceForSubject(l.rev, l.g.kvSubject(l.g.leaseKey(l.gh))))
	if err != nil {
		return l.checkLost(err)
	}
	return nil
}

// release deletes the lease (after the holder's last state write), so the
// next holder need not wait for it to expire.
func (l *lease) release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost.Swap(true) {
		return ErrLeaseLost
	}
	return l.g.kv.Delete(ctx, l.g.leaseKey(l.gh), jetstream.LastRevision(l.rev))
}

// parseLease reads a lease entry as watchers see it.
func parseLease(e jetstream.KeyValueEntry) (leaseView, bool) {
	if e.Operation() != jetstream.KeyValuePut {
		return leaseView{}, false
	}
	var v leaseValue
	if json.Unmarshal(e.Value(), &v) != nil || v.Node == "" {
		return leaseView{}, false
	}
	epoch := v.Epoch
	if epoch == 0 {
		epoch = e.Revision()
	}
	return leaseView{node: v.Node, epoch: epoch, rev: e.Revision()}, true
}
