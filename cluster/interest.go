package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// maxConsumerFilters bounds the filter subjects of a node's consumer; past
// it the node reads every queued message and matches locally.
const maxConsumerFilters = 1000

// interest is a node's reference-counted interest: MQTT filters, the core
// subscriptions they need and the filter subjects of its consumer.
type interest struct {
	mu      sync.Mutex
	filters map[string]int                // MQTT filter -> local subscriptions using it
	core    map[string]*nats.Subscription // core subject -> subscription
	coreRef map[string]int                // core subject -> filters using it
	queued  map[string]int                // KL_MSGS filter subject -> filters using it
	version uint64                        // bumped on every change of queued
	applied uint64                        // the version the consumer has
	wake    chan struct{}                 // closed and replaced when applied changes
	kick    chan struct{}                 // wakes the update loop
}

func (i *interest) init() {
	i.filters = map[string]int{}
	i.core = map[string]*nats.Subscription{}
	i.coreRef = map[string]int{}
	i.queued = map[string]int{}
	i.wake = make(chan struct{})
	i.kick = make(chan struct{}, 1)
}

// AddInterest registers one local subscription to MQTT filter f (no $share
// prefix). The first subscription to a filter subscribes the node on NATS;
// AddInterest returns once messages published from then on anywhere in the
// cluster will reach the node, or ctx ends.
func (n *Node) AddInterest(ctx context.Context, f string) error {
	coreSubjects, err := FilterSubjects(KindMessage, f)
	if err != nil {
		return err
	}
	queuedSubjects, _ := FilterSubjects(KindQueued, f)
	i := &n.interest
	i.mu.Lock()
	i.filters[f]++
	if i.filters[f] > 1 {
		i.mu.Unlock()
		return nil
	}
	for _, s := range coreSubjects {
		i.coreRef[s]++
		if i.core[s] != nil {
			continue
		}
		sub, err := n.nc.ChanQueueSubscribe(s, n.queue, n.coreCh)
		if err != nil {
			i.mu.Unlock()
			n.RemoveInterest(f)
			return fmt.Errorf("cluster: subscribe %s: %w", s, err)
		}
		i.core[s] = sub
	}
	for _, s := range queuedSubjects {
		i.queued[s]++
	}
	i.version++
	v := i.version
	i.mu.Unlock()
	n.kickUpdate()
	if err := n.nc.FlushTimeout(n.cfg.RequestTimeout); err != nil {
		return fmt.Errorf("cluster: flush subscription: %w", err)
	}
	return n.waitApplied(ctx, v)
}

// RemoveInterest undoes one AddInterest.
func (n *Node) RemoveInterest(f string) {
	coreSubjects, err := FilterSubjects(KindMessage, f)
	if err != nil {
		return
	}
	queuedSubjects, _ := FilterSubjects(KindQueued, f)
	i := &n.interest
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.filters[f] == 0 {
		return
	}
	i.filters[f]--
	if i.filters[f] > 0 {
		return
	}
	delete(i.filters, f)
	for _, s := range coreSubjects {
		if i.coreRef[s]--; i.coreRef[s] > 0 {
			continue
		}
		delete(i.coreRef, s)
		if sub := i.core[s]; sub != nil {
			_ = sub.Unsubscribe()
			delete(i.core, s)
		}
	}
	for _, s := range queuedSubjects {
		if i.queued[s]--; i.queued[s] <= 0 {
			delete(i.queued, s)
		}
	}
	i.version++
	n.kickUpdate()
}

// Filters returns the MQTT filters the node has interest in, sorted.
func (n *Node) Filters() []string {
	i := &n.interest
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make([]string, 0, len(i.filters))
	for f := range i.filters {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

func (n *Node) kickUpdate() {
	select {
	case n.interest.kick <- struct{}{}:
	default:
	}
}

func (n *Node) waitApplied(ctx context.Context, v uint64) error {
	i := &n.interest
	for {
		i.mu.Lock()
		if i.applied >= v {
			i.mu.Unlock()
			return nil
		}
		wake := i.wake
		i.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("cluster: consumer update: %w", ctx.Err())
		case <-n.stop:
			return ErrNotReady
		}
	}
}

// updateLoop keeps the consumer's filter subjects equal to the interest,
// coalescing changes that arrive while an update is on its way.
func (n *Node) updateLoop() {
	i := &n.interest
	for {
		select {
		case <-n.stop:
			return
		case <-i.kick:
		}
		i.mu.Lock()
		v := i.version
		if i.applied >= v {
			i.mu.Unlock()
			continue
		}
		subjects := make([]string, 0, len(i.queued))
		for s := range i.queued {
			subjects = append(subjects, s)
		}
		i.mu.Unlock()
		cfg := n.consumer
		cfg.FilterSubject = ""
		cfg.FilterSubjects = consumerFilters(subjects)
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RequestTimeout)
			_, err := n.js.UpdateConsumer(ctx, StreamMessages, cfg)
			cancel()
			if err == nil {
				n.Stats.ConsumerUpdates.Add(1)
				break
			}
			n.log.Warn("updating the node's consumer failed; retrying", "error", err, "attempt", attempt+1)
			if !n.sleep(backoff(attempt)) {
				return
			}
		}
		i.mu.Lock()
		i.applied = v
		close(i.wake)
		i.wake = make(chan struct{})
		i.mu.Unlock()
		n.kickUpdate() // changes that came in meanwhile
	}
}

// consumerFilters turns a set of filter subjects into one JetStream accepts:
// no subject that another one contains, at most maxConsumerFilters, never
// empty (an unreachable subject stands for no interest).
func consumerFilters(subjects []string) []string {
	slices.Sort(subjects)
	subjects = slices.Compact(subjects)
	out := make([]string, 0, len(subjects))
	for _, s := range subjects {
		covered := false
		for _, o := range subjects {
			if o != s && subjectContains(o, s) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, s)
		}
	}
	switch {
	case len(out) == 0:
		return []string{Prefix + "." + KindQueued + "." + classTopic + "." + unreachableLevel}
	case len(out) > maxConsumerFilters:
		return []string{Prefix + "." + KindQueued + ".>"}
	}
	return out
}

// subjectContains reports whether every subject that b matches, a matches too.
func subjectContains(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i, t := range at {
		if t == ">" {
			return len(bt) > i
		}
		if i >= len(bt) || bt[i] == ">" {
			return false
		}
		if t == "*" {
			continue
		}
		if bt[i] == "*" || bt[i] != t {
			return false
		}
	}
	return len(at) == len(bt)
}

// startConsumer replaces the node's durable consumer with a fresh one: a
// restarted node has no sessions in memory, so nothing it missed while down
// is for it (sessions come back through Replay when their clients do).
func (n *Node) startConsumer(ctx context.Context) error {
	name := "kl-node-" + NodeHash(n.cfg.NodeID)
	n.consumer = jetstream.ConsumerConfig{
		Durable:           name,
		Description:       "Keyline node " + n.cfg.NodeID,
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           30 * 1e9,
		MaxAckPending:     20000,
		FilterSubjects:    consumerFilters(nil),
		InactiveThreshold: 3600 * 1e9,
		Replicas:          n.replicas,
	}
	if err := n.js.DeleteConsumer(ctx, StreamMessages, name); err != nil && !isNotFound(err) {
		return fmt.Errorf("cluster: delete the node's old consumer: %w", err)
	}
	cons, err := n.js.CreateConsumer(ctx, StreamMessages, n.consumer)
	if err != nil {
		return fmt.Errorf("cluster: create the node's consumer: %w", err)
	}
	n.goFunc(func() { n.queuedLoop(cons) })
	return nil
}

func isNotFound(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "not found") || errorsIs(err, jetstream.ErrConsumerNotFound))
}
