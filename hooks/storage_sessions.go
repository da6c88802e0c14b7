package hooks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/persistence"
	"github.com/keyline-mq/keyline/sessionstore"
)

// The Storage hook's session records: one sessionstore.Record per
// persistent session, its State the session's client and subscriptions
// (internal/sessionstate). Each change reads the record, changes it and
// writes it back compare-and-set on the revision read, so two hooks racing
// on one client id (a takeover, an expiry) cannot lose each other's change:
// the one refused reads again.

// recordAttempts bounds the rereads of one change that keeps losing its
// compare-and-set (only another writer of the same client id can cause one).
const recordAttempts = 8

// updateRecord applies change to the state of client id's session record
// (a new state if there is none; change returns false to write nothing)
// and writes it, durably, before it returns.
func (h *Storage) updateRecord(id string, change func(st *sessionstate.State) bool) error {
	ctx := context.Background() // the data file's store does not block on anything but its commit
	for range recordAttempts {
		rec, rev, err := h.records.Load(ctx, id)
		if errors.Is(err, sessionrec.ErrCorrupt) {
			h.Log.Error("storage: replacing a session record that cannot be decoded", "client", clip(id), "error", err)
			rec, err = nil, nil
		}
		if err != nil {
			return err
		}
		st := &sessionstate.State{}
		if rec != nil {
			if st, err = sessionstate.Decode(id, rec.State); err != nil {
				h.Log.Error("storage: replacing an unreadable session record", "client", clip(id), "error", err)
				st = &sessionstate.State{}
			}
		}
		if !change(st) {
			return nil
		}
		slices.SortFunc(st.Subs, func(a, b sessionstate.Sub) int { return strings.Compare(a.Filter, b.Filter) })
		_, err = h.records.Save(ctx, &sessionstore.Record{ClientID: id, Persistent: true, State: sessionstate.Encode(nil, st)}, rev)
		if !errors.Is(err, sessionstore.ErrRevision) {
			return err
		}
	}
	return fmt.Errorf("storage: session record of %q kept changing", clip(id))
}

// deleteRecord deletes client id's session record, if any.
func (h *Storage) deleteRecord(id string) error {
	ctx := context.Background()
	for range recordAttempts {
		rec, rev, err := h.records.Load(ctx, id)
		if err != nil || rec == nil {
			return err
		}
		if err = h.records.Delete(ctx, id, rev); !errors.Is(err, sessionstore.ErrRevision) {
			return err
		}
	}
	return fmt.Errorf("storage: session record of %q kept changing", clip(id))
}

// forget removes everything stored for a client.
func (h *Storage) forget(id string) {
	if err := h.deleteRecord(id); err != nil {
		h.Log.Error("storage: delete session record", "client", clip(id), "error", err)
	}
	p := clientPrefix(id)
	h.store.DeletePrefix(persistence.KindInflight, p)
	h.store.DeletePrefix(persistence.KindKeyFilters, p)
}

// OnSessionEstablished records a persistent client, or forgets a session that
// a clean start has just discarded.
func (h *Storage) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if !persistent(cl) {
		h.forget(cl.ID)
		return
	}
	// A clean start discarded the session's subscriptions (mochi
	// unsubscribed the client it took over); a resumed session keeps them.
	h.putClient(cl, cl.Properties.Clean)
}

// OnWillSent updates the client record once its will has been sent.
func (h *Storage) OnWillSent(cl *mqtt.Client, _ packets.Packet) {
	if persistent(cl) {
		h.putClient(cl, false)
	}
}

func (h *Storage) putClient(cl *mqtt.Client, clean bool) {
	c := storageClient(cl)
	err := h.updateRecord(cl.ID, func(st *sessionstate.State) bool {
		st.Client = c
		if clean {
			st.Subs = nil
		}
		return true
	})
	if err != nil {
		h.Log.Error("storage: session record not stored", "client", clip(cl.ID), "error", err)
	}
}

// storageClient is cl as mochi restores a client (loadClients).
func storageClient(cl *mqtt.Client) storage.Client {
	props := cl.Properties.Props.Copy()
	return storage.Client{
		ID:              cl.ID,
		T:               storage.ClientKey,
		Remote:          cl.Net.Remote,
		Listener:        cl.Net.Listener,
		Username:        cl.Properties.Username,
		Clean:           cl.Properties.Clean,
		ProtocolVersion: cl.Properties.ProtocolVersion,
		Properties: storage.ClientProperties{
			SessionExpiryInterval:     props.SessionExpiryInterval,
			SessionExpiryIntervalFlag: props.SessionExpiryIntervalFlag,
			AuthenticationMethod:      props.AuthenticationMethod,
			AuthenticationData:        props.AuthenticationData,
			RequestProblemInfo:        props.RequestProblemInfo,
			RequestProblemInfoFlag:    props.RequestProblemInfoFlag,
			RequestResponseInfo:       props.RequestResponseInfo,
			ReceiveMaximum:            props.ReceiveMaximum,
			TopicAliasMaximum:         props.TopicAliasMaximum,
			User:                      props.User,
			MaximumPacketSize:         props.MaximumPacketSize,
		},
		Will: storage.ClientWill(cl.Properties.Will),
	}
}

// OnSubscribed stores granted subscriptions of a persistent session in its
// record and waits for the commit, so a SUBACK means the subscriptions
// survive a crash. If the record cannot be written (a failed commit, a
// client id bbolt refuses as a key) the SUBSCRIBE's granted filters are
// refused instead: SUBACK 0x80, and mochi's subscriptions are taken back.
func (h *Storage) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if !persistent(cl) {
		return
	}
	var subs []storage.Subscription
	var idx []int
	for i, f := range pk.Filters {
		if i >= len(reasonCodes) || reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		subs = append(subs, storage.Subscription{
			ID:                f.Filter,
			T:                 storage.SubscriptionKey,
			Client:            cl.ID,
			Qos:               reasonCodes[i],
			Filter:            f.Filter,
			Identifier:        f.Identifier,
			NoLocal:           f.NoLocal,
			RetainHandling:    f.RetainHandling,
			RetainAsPublished: f.RetainAsPublished,
		})
		idx = append(idx, i)
	}
	if len(subs) == 0 {
		return
	}
	c := storageClient(cl)
	err := h.updateRecord(cl.ID, func(st *sessionstate.State) bool {
		if st.Client.ID == "" { // no record: its establishment was not stored
			st.Client = c
		}
		for _, sub := range subs {
			st.Subs = slices.DeleteFunc(st.Subs, func(s sessionstate.Sub) bool { return s.Filter == sub.Filter })
			st.Subs = append(st.Subs, sessionstate.Sub{Subscription: sub})
		}
		return true
	})
	if err != nil {
		h.Log.Error("storage: subscriptions not stored; refusing them", "client", clip(cl.ID), "filters", len(subs), "error", err)
		for _, i := range idx {
			refuseSubscription(h.server, cl, pk.Filters[i].Filter, reasonCodes, i, packets.ErrUnspecifiedError)
		}
	}
}

// OnUnsubscribed removes subscriptions from the session's record.
func (h *Storage) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	if !persistent(cl) {
		return
	}
	err := h.updateRecord(cl.ID, func(st *sessionstate.State) bool {
		n := len(st.Subs)
		for _, f := range pk.Filters {
			st.Subs = slices.DeleteFunc(st.Subs, func(s sessionstate.Sub) bool { return s.Filter == f.Filter })
		}
		return len(st.Subs) != n && st.Client.ID != ""
	})
	if err != nil {
		h.Log.Error("storage: unsubscribe not stored", "client", clip(cl.ID), "error", err)
	}
}

// StoredClients returns the stored clients, reading every session record
// once: their subscriptions wait for StoredSubscriptions, which mochi
// calls next (readStore).
func (h *Storage) StoredClients() ([]storage.Client, error) {
	var clients []storage.Client
	h.restored = nil
	err := h.records.ForEach(context.Background(), func(rec *sessionstore.Record, _ uint64) bool {
		st, err := sessionstate.Decode(rec.ClientID, rec.State)
		if err != nil {
			// One unreadable record must not cost every other session.
			h.Log.Error("storage: skipping an unreadable session record", "client", clip(rec.ClientID), "error", err)
			return true
		}
		clients = append(clients, st.Client)
		for _, sub := range st.Subs {
			h.restored = append(h.restored, sub.Subscription)
		}
		return true
	})
	if errors.Is(err, sessionrec.ErrCorrupt) {
		// ForEach went past the records it could not decode: the broker
		// starts with every other session (a bad one stays in the file
		// until its client's next session replaces it, updateRecord).
		h.Log.Error("storage: skipping session records that cannot be decoded", "error", err)
		err = nil
	}
	return clients, err
}

// StoredSubscriptions returns the subscriptions of the clients
// StoredClients returned.
func (h *Storage) StoredSubscriptions() ([]storage.Subscription, error) {
	subs := h.restored
	h.restored = nil
	return subs, nil
}
