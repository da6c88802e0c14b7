package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

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
	addedAt map[string]uint64             // MQTT filter -> the version that added it
	core    map[string]*nats.Subscription // core subject -> subscription
	coreRef map[string]int                // core subject -> filters using it
	queued  map[string]int                // KL_MSGS filter subject -> filters using it
	version uint64                        // bumped on every change of queued
	applied uint64                        // the version the consumer has
	wake    chan struct{}                 // closed and replaced when applied changes

	current        jetstream.MessagesContext // the queued loop's consumer
	currentVersion uint64                    // the version it was made for
}

func (i *interest) init() {
	i.filters = map[string]int{}
	i.addedAt = map[string]uint64{}
	i.core = map[string]*nats.Subscription{}
	i.coreRef = map[string]int{}
	i.queued = map[string]int{}
	i.wake = make(chan struct{})
}

// AddInterest registers one local subscription to MQTT filter f (no $share
// prefix). The first subscription to a filter subscribes the node on NATS;
// AddInterest returns once messages published from then on anywhere in the
// cluster will reach the node, or ctx ends.
func (n *Node) AddInterest(ctx context.Context, f string) error { return n.AddInterests(ctx, f) }

// AddInterests is AddInterest for several filters, with one wait.
func (n *Node) AddInterests(ctx context.Context, filters ...string) error {
	i := &n.interest
	i.mu.Lock()
	var wait uint64
	changed := false
	for _, f := range filters {
		coreSubjects, err := FilterSubjects(KindMessage, f)
		if err != nil {
			i.mu.Unlock()
			return err
		}
		queuedSubjects, _ := FilterSubjects(KindQueued, f)
		i.filters[f]++
		if i.filters[f] > 1 {
			wait = max(wait, i.addedAt[f]) // its first subscriber may still be waiting
			continue
		}
		for _, s := range coreSubjects {
			i.coreRef[s]++
			if i.core[s] != nil {
				continue
			}
			sub, err := n.nc.ChanQueueSubscribe(s, n.queue, n.coreCh)
			if err != nil {
				n.removeLocked(f) // also the subjects of f not counted yet: their counts end at or below 0 and go
				if changed {
					i.version++
					n.kickUpdate()
				}
				i.mu.Unlock()
				return fmt.Errorf("cluster: subscribe %s: %w", s, err)
			}
			i.core[s] = sub
		}
		for _, s := range queuedSubjects {
			i.queued[s]++
		}
		changed = true
		i.addedAt[f] = i.version + 1
	}
	if changed {
		i.version++
		wait = i.version
		n.kickUpdate()
	}
	i.mu.Unlock()
	if err := n.nc.FlushTimeout(n.cfg.RequestTimeout); err != nil {
		return fmt.Errorf("cluster: flush subscription: %w", err)
	}
	return n.waitApplied(ctx, wait)
}

// RemoveInterest undoes one AddInterest.
func (n *Node) RemoveInterest(f string) {
	i := &n.interest
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.filters[f] == 0 {
		return
	}
	n.removeLocked(f)
	if i.filters[f] == 0 {
		i.version++
		n.kickUpdate()
	}
}

// removeLocked drops one reference to filter f, and its subjects with the last.
func (n *Node) removeLocked(f string) {
	i := &n.interest
	if i.filters[f]--; i.filters[f] > 0 {
		return
	}
	delete(i.filters, f)
	delete(i.addedAt, f)
	coreSubjects, _ := FilterSubjects(KindMessage, f)
	queuedSubjects, _ := FilterSubjects(KindQueued, f)
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

// kickUpdate makes the queued loop replace its consumer (called with
// interest.mu held, after a change of the filter subjects).
func (n *Node) kickUpdate() {
	if i := &n.interest; i.current != nil && i.currentVersion < i.version {
		i.current.Stop()
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

// queuedLoop reads KL_MSGS through an ordered consumer (ephemeral, R1,
// in memory, gap-free: nats.go recreates it from the last sequence it
// delivered when it misses one, and on reconnects) whose filter subjects are
// the node's interest. An interest change replaces the consumer with one
// that starts right after the last message handled, so nothing is skipped
// and nothing handled twice.
func (n *Node) queuedLoop() {
	i := &n.interest
	for attempt := 0; !n.stopped(); {
		i.mu.Lock()
		v := i.version
		subjects := make([]string, 0, len(i.queued))
		for s := range i.queued {
			subjects = append(subjects, s)
		}
		i.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RequestTimeout)
		cons, err := n.js.OrderedConsumer(ctx, StreamMessages, jetstream.OrderedConsumerConfig{
			FilterSubjects:    consumerFilters(subjects),
			DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:       n.queuedPos.Load() + 1,
			InactiveThreshold: 30 * time.Second,
			// One recreation by nats.go, then Next returns the error and
			// this loop recreates the consumer with its own, shorter
			// timeouts: nats.go retries without end, each try waiting 10 s
			// and the pauses doubling to 10 s, which after the stream
			// leader's server was killed was seen to leave a node's
			// subscribers without messages for more than 30 s
			// (TestClusterPipelinedNATSServerKilled, 2 of 10 runs).
			MaxResetAttempts: 1,
		})
		cancel()
		var it jetstream.MessagesContext
		if err == nil {
			it, err = cons.Messages(pullOpts(1000)...)
		}
		if err != nil {
			n.log.Warn("reading queued messages: consumer not created; retrying", "error", err, "attempt", attempt+1)
			if !n.sleep(backoff(attempt)) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		n.Stats.ConsumerUpdates.Add(1)
		if !n.trackIterator(it) {
			return
		}
		i.mu.Lock()
		i.current, i.currentVersion = it, v
		if v > i.applied {
			i.applied = v
			close(i.wake)
			i.wake = make(chan struct{})
		}
		stale := i.version > v
		i.mu.Unlock()
		if stale {
			it.Stop() // the interest changed meanwhile
		}
		n.readQueued(it)
		n.untrackIterator(it)
		it.Stop()
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
