package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/persistence"
)

// boltRetained is the retained store of one node: the data file's retained
// bucket, one record per topic (mochi's storage.Message, as it always was).
// It has no other store to follow: only what mochi's index already took
// changes it, so apply runs only at opening and CatchUp returns at once.
type boltRetained struct {
	store *persistence.SessionStore
}

// NewBoltRetained opens the retained store of one node over store, applying
// every retained message it holds (RetainedStore's contract).
func NewBoltRetained(store *persistence.SessionStore, apply func(packets.Packet)) (RetainedStore, error) {
	now := time.Now().Unix()
	err := store.ForEach(persistence.KindRetained, func(_, val []byte) error {
		var m storage.Message
		if err := json.Unmarshal(val, &m); err != nil {
			return nil // one unreadable record must not cost every other retained message
		}
		pk := m.ToPacket()
		if iv := pk.Properties.MessageExpiryInterval; iv > 0 {
			if pk.Expiry = pk.Created + int64(iv); pk.Expiry < now {
				return nil
			}
		}
		apply(pk)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hooks: load retained messages: %w", err)
	}
	return boltRetained{store}, nil
}

// Retain commits pk (an empty payload: deletes its topic's record). A
// topic longer than bbolt's 32 KiB keys, or a failed commit, is an error.
func (s boltRetained) Retain(_ context.Context, pk packets.Packet) error {
	w := persistence.SessionWrite{Kind: persistence.KindRetained, Key: []byte(pk.TopicName), Delete: len(pk.Payload) == 0}
	if !w.Delete {
		m := storedMessage(pk)
		m.ID, m.T, m.Client = pk.TopicName, storage.RetainedKey, pk.Origin
		data, err := m.MarshalBinary()
		if err != nil {
			return fmt.Errorf("hooks: encode retained message: %w", err)
		}
		w.Val = data
	}
	return s.store.Write(w)[0]
}

// CatchUp returns at once: no other store writes this one's file.
func (boltRetained) CatchUp(context.Context) error { return nil }

// Expired deletes topic's record (write-behind).
func (s boltRetained) Expired(topic string) {
	s.store.Delete(persistence.KindRetained, []byte(topic))
}
