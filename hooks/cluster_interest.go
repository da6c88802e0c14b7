package hooks

import (
	"context"
	"errors"
	"log/slog"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
)

// interestNode is what the node's interest needs of the cluster node.
type interestNode interface {
	// AddInterests makes the node's consumer take filters, returning once
	// other nodes' messages for them reach this node.
	AddInterests(ctx context.Context, filters ...string) error
	// RemoveInterest drops one reference to filter.
	RemoveInterest(filter string)
	// LastSequence is the last KL_MSGS sequence.
	LastSequence(ctx context.Context) (uint64, error)
}

// interest keeps the node's interest equal to the subscriptions of the
// session copies the table holds, and where each subscription starts in
// KL_MSGS; it stores persistent sessions' subscriptions through the
// writer. It owns no state: each copy holds its filters, under its lock.
type interest struct {
	node   interestNode // set by Cluster.SetNode
	table  *sessionTable
	writer *recordWriter
	log    func() *slog.Logger
}

// subscribed registers the granted subscriptions' filters with the node
// (waiting until other nodes' messages will reach it) and stores them in a
// persistent session's record before the SUBACK goes out.
func (n *interest) subscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	s := n.table.current(cl)
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var added []packets.Subscription
	var fresh []string
	s.mu.Lock()
	for i, f := range pk.Filters {
		if i >= len(reasonCodes) || reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		sub := f
		sub.Qos = reasonCodes[i]
		added = append(added, sub) // new, or the same filter with new options
		if mqtt.IsSharedFilter(f.Filter) {
			continue // in the record only: a Key-Shared group has a log of its own
		}
		if _, known := s.since[f.Filter]; !known {
			s.setSinceLocked(f.Filter, sincePending) // takes no queued message yet
			fresh = append(fresh, f.Filter)
		}
	}
	s.mu.Unlock()
	var since uint64
	if len(fresh) > 0 {
		n.add(ctx, s, fresh...)
		// Read once the node's consumer takes the filters: every later
		// message reaches this node.
		var err error
		if since, err = n.node.LastSequence(ctx); err != nil {
			n.log().Warn("cluster: subscription start unknown; it may get messages published just before it", "client", cl.ID, "error", err)
		}
		s.mu.Lock()
		for _, f := range fresh {
			s.setSinceLocked(f, since)
		}
		s.mu.Unlock()
	}
	if len(added) > 0 && s.persistent.Load() {
		n.writer.saveSubscriptions(ctx, s, added, since, nil)
	}
}

// unsubscribed drops the filters from the node's interest and the record.
func (n *interest) unsubscribed(cl *mqtt.Client, pk packets.Packet) {
	s := n.table.current(cl)
	if s == nil {
		return
	}
	var removed []string
	for _, f := range pk.Filters {
		if mqtt.IsSharedFilter(f.Filter) {
			s.mu.Lock()
			_, ok := s.subs[f.Filter]
			s.mu.Unlock()
			if ok {
				removed = append(removed, f.Filter)
			}
		} else if n.remove(s, f.Filter) {
			removed = append(removed, f.Filter)
		}
	}
	if len(removed) > 0 && s.persistent.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.writer.saveSubscriptions(ctx, s, nil, 0, removed)
	}
}

// add registers the session's new filters with the node and waits until
// other nodes' messages for them reach it.
func (n *interest) add(ctx context.Context, s *clusterSession, filters ...string) {
	var fresh []string
	s.mu.Lock()
	for _, f := range filters {
		if !s.filters[f] {
			s.filters[f] = true
			fresh = append(fresh, f)
		}
	}
	s.mu.Unlock()
	if len(fresh) == 0 {
		return
	}
	if err := n.node.AddInterests(ctx, fresh...); err != nil && !errors.Is(err, cluster.ErrInvalidTopic) {
		n.log().Warn("cluster: subscription not yet known to the other nodes", "filters", fresh, "error", err)
	}
}

// remove drops one filter of the session from the node's interest; false:
// the session had not registered it.
func (n *interest) remove(s *clusterSession, filter string) bool {
	s.mu.Lock()
	had := s.filters[filter]
	delete(s.filters, filter)
	delete(s.since, filter)
	s.mu.Unlock()
	if had {
		n.node.RemoveInterest(filter)
	}
	return had
}

// drop forgets a session's filters on the node (and marks the copy
// released).
func (n *interest) drop(s *clusterSession) {
	s.released.Store(true)
	s.mu.Lock()
	filters := s.filters
	s.filters = map[string]bool{}
	s.mu.Unlock()
	for f := range filters {
		n.node.RemoveInterest(f)
	}
}
