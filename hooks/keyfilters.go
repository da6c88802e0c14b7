package hooks

import (
	"encoding/json"
	"log/slog"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/keyline-mq/keyline/persistence"
)

// KeyFilterStore keeps the key filters of persistent sessions' shared
// subscriptions where the session's subscriptions are kept, so that a
// session resumed (after a broker restart, or on another node) rejoins its
// groups with them. One node keeps them in the data file
// (StoredKeyFilters); a cluster node in the session's record (Cluster).
//
// Contract (both implementations):
//   - SaveKeyFilters records filters for cl's shared subscription filter,
//     replacing what was recorded; none forgets them. It does nothing for
//     a session that is not persistent. What it records is durable by the
//     time the SUBACK goes out (written before it returns, or by the write
//     of the session's subscriptions that the SUBSCRIBE makes anyway): an
//     error means the subscription is not to be granted.
//   - ForgetKeyFilters forgets them for an UNSUBSCRIBE, without waiting
//     (as the subscription's own removal does not).
//   - KeyFilters returns what was recorded for the session of cl (by its
//     client id), nil when nothing was; it never fails (an unreadable
//     record is logged and reads as none: the member takes every key).
type KeyFilterStore interface {
	SaveKeyFilters(cl *mqtt.Client, filter string, filters []string) error
	ForgetKeyFilters(cl *mqtt.Client, filter string)
	KeyFilters(cl *mqtt.Client, filter string) []string
}

// StoredKeyFilters is one node's KeyFilterStore, in the session store.
type StoredKeyFilters struct {
	Sessions *persistence.SessionStore
	Log      *slog.Logger
}

// SaveKeyFilters implements KeyFilterStore; it waits for the commit.
func (s StoredKeyFilters) SaveKeyFilters(cl *mqtt.Client, filter string, filters []string) error {
	if !persistent(cl) {
		return nil
	}
	w := persistence.SessionWrite{Kind: persistence.KindKeyFilters, Key: subscriptionKey(cl.ID, filter), Delete: len(filters) == 0}
	if !w.Delete {
		data, err := json.Marshal(filters)
		if err != nil {
			return err
		}
		w.Val = data
	}
	return s.Sessions.Write(w)[0]
}

// ForgetKeyFilters implements KeyFilterStore: a queued delete.
func (s StoredKeyFilters) ForgetKeyFilters(cl *mqtt.Client, filter string) {
	if persistent(cl) {
		s.Sessions.Delete(persistence.KindKeyFilters, subscriptionKey(cl.ID, filter))
	}
}

// KeyFilters implements KeyFilterStore.
func (s StoredKeyFilters) KeyFilters(cl *mqtt.Client, filter string) []string {
	data, err := s.Sessions.Get(persistence.KindKeyFilters, subscriptionKey(cl.ID, filter))
	if err != nil || data == nil {
		return nil
	}
	var filters []string
	if err := json.Unmarshal(data, &filters); err != nil {
		s.Log.Warn("unreadable stored key filters: the member takes every key", "client", clip(cl.ID), "filter", clip(filter), "error", err)
		return nil
	}
	return filters
}
