package hooks

import (
	"slices"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// SaveKeyFilters implements KeyFilterStore: in the session's record. It
// only marks the record to be written: the SUBSCRIBE's own write of the
// session's subscriptions (OnSubscribed, after Key-Shared's, before the
// SUBACK) carries it, so one record write covers both.
func (h *Cluster) SaveKeyFilters(cl *mqtt.Client, filter string, filters []string) error {
	h.setKeyFilters(cl, filter, filters)
	return nil
}

// ForgetKeyFilters implements KeyFilterStore: the UNSUBSCRIBE's write of
// the session's subscriptions (OnUnsubscribed) carries it.
func (h *Cluster) ForgetKeyFilters(cl *mqtt.Client, filter string) {
	h.setKeyFilters(cl, filter, nil)
}

// setKeyFilters records filters (none: forgets them) in the copy of cl's
// session, marking its record to be written if they changed.
func (h *Cluster) setKeyFilters(cl *mqtt.Client, filter string, filters []string) {
	s := h.session(cl)
	if s == nil || !s.persistent.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Equal(s.kf[filter], filters) {
		return
	}
	if len(filters) == 0 {
		delete(s.kf, filter)
	} else {
		s.kf[filter] = slices.Clone(filters)
	}
	s.dirty = true
}

// KeyFilters implements KeyFilterStore: from the copy of the session this
// node holds (restored from its record when it came from another node).
func (h *Cluster) KeyFilters(cl *mqtt.Client, filter string) []string {
	s := h.session(cl)
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.kf[filter])
}
