package hooks

import (
	"slices"

	"github.com/keyline-mq/keyline/internal/filter"
	"github.com/keyline-mq/keyline/internal/sessionstate"
)

// Which queued (JetStream) messages a cluster session takes: those its
// subscriptions match and that came after each subscription was made.

// takesQueued reports whether a queued message at sequence seq on topic is
// for this session: not replayed to it already, and matching a subscription
// made before it was published (a node's consumer may hand it messages
// published shortly before a new subscription).
func (s *clusterSession) takesQueued(topic string, seq uint64) bool {
	if seq <= s.replayedTo.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.maxSince {
		return true
	}
	for f, since := range s.since {
		if since < seq && filter.Match(f, topic) {
			return true
		}
	}
	return false
}

// matchSession returns the QoS and subscription identifiers with which a
// session's subscriptions take a message at sequence seq.
func matchSession(subs []sessionstate.Sub, topic string, seq uint64) (qos byte, ids []int, ok bool) {
	for _, s := range subs {
		if s.Since >= seq || !filter.Match(s.Filter, topic) {
			continue
		}
		ok = true
		qos = max(qos, s.Qos)
		if s.Identifier > 0 {
			ids = append(ids, s.Identifier)
		}
	}
	slices.Sort(ids)
	return qos, ids, ok
}
