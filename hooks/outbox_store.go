package hooks

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/persistence"
)

// outboxStore keeps persistent sessions' outboxes in the session store:
// under the client's prefix, the big-endian sequence number of each message
// (publish order, so a prefix scan reads a session in order) and, under
// sequence number 0, the session's record. Writes are behind, like mochi's
// in-flight messages were: a crash can lose the newest.
type outboxStore struct {
	store *persistence.SessionStore
}

// NewOutboxStore returns the outbox.Store over store.
func NewOutboxStore(store *persistence.SessionStore) outbox.Store {
	return outboxStore{store: store}
}

func outboxKey(client string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(clientPrefix(client), seq)
}

func (s outboxStore) Put(client string, m outbox.Stored) {
	s.store.Put(persistence.KindOutbox, outboxKey(client, m.Seq), m.Record())
}

func (s outboxStore) Delete(client string, seq, _ uint64) {
	s.store.Delete(persistence.KindOutbox, outboxKey(client, seq))
}

func (s outboxStore) PutMeta(client string, meta []byte) {
	s.store.Put(persistence.KindOutbox, outboxKey(client, 0), meta)
}

func (s outboxStore) DeleteSession(client string) {
	s.store.DeletePrefix(persistence.KindOutbox, clientPrefix(client))
}

// storedOutbox is one session's stored outbox.
type storedOutbox struct {
	meta []byte
	recs []outbox.Record
}

// loadOutboxes reads every stored outbox, by client id.
func loadOutboxes(store *persistence.SessionStore) (map[string]*storedOutbox, error) {
	out := map[string]*storedOutbox{}
	err := store.ForEach(persistence.KindOutbox, func(key, val []byte) error {
		n, used := binary.Uvarint(key)
		if used <= 0 || len(key) != used+int(n)+8 {
			return fmt.Errorf("hooks: malformed outbox key %x", key)
		}
		client := string(key[used : used+int(n)])
		seq := binary.BigEndian.Uint64(key[used+int(n):])
		so := out[client]
		if so == nil {
			so = &storedOutbox{}
			out[client] = so
		}
		if seq == 0 {
			so.meta = bytes.Clone(val)
		} else {
			so.recs = append(so.recs, outbox.Record{Seq: seq, Val: bytes.Clone(val)})
		}
		return nil
	})
	return out, err
}

// RestoreSessions loads the persistent sessions' outboxes from store. Call
// it before the server starts; sessions mochi does not restore (expired)
// are dropped once it has started.
func (h *Fanout) RestoreSessions(store *persistence.SessionStore) error {
	all, err := loadOutboxes(store)
	if err != nil {
		return fmt.Errorf("hooks: load session outboxes: %w", err)
	}
	for client, so := range all {
		o := outbox.New(client, h.sessions.cfg)
		for _, err := range o.Restore(so.meta, so.recs) {
			h.Log.Error("fanout: skipping an unreadable stored message", "client", clip(client), "error", err)
		}
		h.sessions.restore(client, o)
	}
	return nil
}
