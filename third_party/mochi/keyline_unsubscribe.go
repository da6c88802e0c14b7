package mqtt

import (
	"sync/atomic"

	"github.com/mochi-mqtt/server/v2/packets"
)

// UnsubscribeFilters removes the named filters from cl's subscriptions as an
// UNSUBSCRIBE of them would, without an UNSUBACK (the client did not ask),
// and tells the hooks (OnUnsubscribed) of the ones it held. It returns how
// many it held. Keyline calls it when a reload takes away a client's right
// to subscriptions it holds. (Keyline addition, PATCHES.md.)
func (s *Server) UnsubscribeFilters(cl *Client, filters []string) int {
	var removed []packets.Subscription
	for _, f := range filters {
		sub, ok := cl.State.Subscriptions.Get(f)
		if !ok {
			continue
		}
		cl.State.Subscriptions.Delete(f)
		if s.Topics.Unsubscribe(f, cl.ID) {
			atomic.AddInt64(&s.Info.Subscriptions, -1)
		}
		removed = append(removed, sub)
	}
	if len(removed) > 0 {
		s.hooks.OnUnsubscribed(cl, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe}, Filters: removed})
	}
	return len(removed)
}
