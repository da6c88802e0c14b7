package hooks

import (
	"slices"
	"sort"
)

// MemberInfo is what a group knows of one member's subscription.
type MemberInfo struct {
	ID string
	// QoS is the QoS granted to the member's subscription.
	QoS byte
	// KeyFilters are the member's key-filter patterns; none means every key.
	KeyFilters []string
	// Connected reports whether the client is connected now.
	Connected bool
}

// MemberInfos returns the members of a group with their subscriptions, sorted by id.
func (h *KeyShared) MemberInfos(group string) []MemberInfo {
	h.mu.RLock()
	var out []MemberInfo
	for id, gs := range h.mu.members {
		if m, ok := gs[group]; ok {
			out = append(out, MemberInfo{ID: id, QoS: m.qos, KeyFilters: slices.Clone(m.keyFilters)})
		}
	}
	h.mu.RUnlock()
	for i := range out {
		if cl, ok := h.server.Clients.Get(out[i].ID); ok {
			out[i].Connected = !cl.Closed()
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
