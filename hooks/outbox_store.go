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

// PutDurable implements outbox.DurableStore: the write commits with the
// store's next commit, and done hears its outcome.
func (s outboxStore) PutDurable(client string, m outbox.Stored, done func(error)) {
	s.store.PutNotify(persistence.KindOutbox, outboxKey(client, m.Seq), m.Record(), done)
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

// Records implements outbox.Loader: a session's stored messages, read
// when it resumes (it was restored cold).
func (s outboxStore) Records(client string) ([]outbox.Record, error) {
	var out []outbox.Record
	// No client's prefix is a prefix of another's (it starts with the id's length).
	err := s.store.ForEachPrefix(persistence.KindOutbox, clientPrefix(client), func(key, val []byte) error {
		_, seq, err := splitOutboxKey(key)
		if err == nil && seq != 0 { // 0: the session record
			out = append(out, outbox.Record{Seq: seq, Val: bytes.Clone(val)})
		}
		return err
	})
	return out, err
}

// Record implements outbox.Loader: one committed message record (a cold
// message's frame, read when it is to be sent).
func (s outboxStore) Record(client string, seq uint64) ([]byte, error) {
	return s.store.Get(persistence.KindOutbox, outboxKey(client, seq))
}

// splitOutboxKey returns the client id and sequence number of an outbox key.
func splitOutboxKey(key []byte) (string, uint64, error) {
	n, used := binary.Uvarint(key)
	if used <= 0 || len(key) != used+int(n)+8 {
		return "", 0, fmt.Errorf("hooks: malformed outbox key %x", key)
	}
	return string(key[used : used+int(n)]), binary.BigEndian.Uint64(key[used+int(n):]), nil
}

// storedOutbox is one session's stored outbox, cold: the figures of its
// messages, not their frames.
type storedOutbox struct {
	meta []byte
	recs []outbox.Cold
}

// loadOutboxes reads every stored outbox, by client id, keeping no frame:
// start-up memory does not grow with what offline sessions hold.
func loadOutboxes(store *persistence.SessionStore) (map[string]*storedOutbox, []error, error) {
	out := map[string]*storedOutbox{}
	var bad []error
	err := store.ForEach(persistence.KindOutbox, func(key, val []byte) error {
		client, seq, err := splitOutboxKey(key)
		if err != nil {
			return err
		}
		so := out[client]
		if so == nil {
			so = &storedOutbox{}
			out[client] = so
		}
		if seq == 0 {
			so.meta = bytes.Clone(val)
			return nil
		}
		c, err := outbox.PeekRecord(seq, val)
		if err != nil {
			bad = append(bad, fmt.Errorf("outbox %q message %d: %w", client, seq, err))
			return nil
		}
		so.recs = append(so.recs, c)
		return nil
	})
	return out, bad, err
}

// RestoreSessions loads the persistent sessions' outboxes from store, cold:
// each message's frame stays on disk until its session resumes. Call it
// before the server starts; sessions mochi does not restore (expired) are
// dropped once it has started.
func (h *Fanout) RestoreSessions(store *persistence.SessionStore) error {
	all, bad, err := loadOutboxes(store)
	if err != nil {
		return fmt.Errorf("hooks: load session outboxes: %w", err)
	}
	for _, err := range bad {
		h.Log.Error("fanout: skipping an unreadable stored message", "error", err)
	}
	for client, so := range all {
		o := outbox.New(client, h.sessions.cfg)
		for _, err := range o.RestoreCold(so.meta, so.recs) {
			h.Log.Error("fanout: skipping an unreadable stored message", "client", clip(client), "error", err)
		}
		h.sessions.restore(client, o)
	}
	return nil
}
