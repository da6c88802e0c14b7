package hooks

import (
	"context"
	"slices"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// SaveKeyFilters implements KeyFilterStore: in the session's record, which
// is written before it returns (a failed write is retried by the record's
// writer, as for the session's subscriptions).
func (h *Cluster) SaveKeyFilters(cl *mqtt.Client, filter string, filters []string) error {
	s := h.session(cl)
	if s == nil || !s.persistent.Load() {
		return nil
	}
	s.mu.Lock()
	old, had := s.kf[filter]
	if len(filters) == 0 {
		delete(s.kf, filter)
	} else {
		s.kf[filter] = slices.Clone(filters)
	}
	changed := had != (len(filters) > 0) || !slices.Equal(old, filters)
	s.dirty = s.dirty || changed
	s.mu.Unlock()
	if changed {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.flush(ctx, s, true)
	}
	return nil
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
