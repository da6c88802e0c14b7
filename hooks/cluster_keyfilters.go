package hooks

import (
	"slices"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// clusterKeyFilters is the KeyFilterStore of cluster mode: the key filters
// live in the session copies of the table, and so in their records. It
// owns nothing; a copy's key filters are under its lock.
type clusterKeyFilters struct{ table *sessionTable }

// SaveKeyFilters implements KeyFilterStore: in the session's record. It
// only marks the record to be written: the SUBSCRIBE's own write of the
// session's subscriptions (OnSubscribed, after Key-Shared's, before the
// SUBACK) carries it, so one record write covers both.
func (k clusterKeyFilters) SaveKeyFilters(cl *mqtt.Client, filter string, filters []string) error {
	k.set(cl, filter, filters)
	return nil
}

// ForgetKeyFilters implements KeyFilterStore: the UNSUBSCRIBE's write of
// the session's subscriptions (OnUnsubscribed) carries it.
func (k clusterKeyFilters) ForgetKeyFilters(cl *mqtt.Client, filter string) {
	k.set(cl, filter, nil)
}

// set records filters (none: forgets them) in the copy of cl's session,
// marking its record to be written if they changed.
func (k clusterKeyFilters) set(cl *mqtt.Client, filter string, filters []string) {
	s := k.table.current(cl)
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
func (k clusterKeyFilters) KeyFilters(cl *mqtt.Client, filter string) []string {
	s := k.table.current(cl)
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.kf[filter])
}
