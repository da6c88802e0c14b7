package persistence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"

	bolt "go.etcd.io/bbolt"

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// FormatVersion is the data format of keyline.db this package writes, kept
// under meta/format. Format 1 (no meta bucket: keylines before formats had
// a number) differs from 2 only in its group checkpoints (state version 2,
// read as they are). Format 2 kept a session's client and subscriptions as
// mochi's JSON records in sessions/clients and sessions/subscriptions;
// format 3 keeps them as one binary session record per client in
// sessions/records (SessionRecords). Opening an older file migrates it one
// format at a time, each step in one transaction that records the next
// format. The segment files carry their own format (seglog.FormatVersion)
// in their headers.
const FormatVersion = 3

// ErrNewerFormat is returned by Open for a keyline.db written in a newer
// format, by a newer keyline; nothing is changed.
var ErrNewerFormat = errors.New("persistence: data written by a newer keyline")

var (
	metaBucket = []byte("meta")
	formatKey  = []byte("format")
)

// migrations[v] turns data format v into v+1 inside one transaction (which
// records v+1), so that a crash leaves the file in one format or the other.
var migrations = map[uint64]func(tx *bolt.Tx, log *slog.Logger) error{
	1: func(*bolt.Tx, *slog.Logger) error { return nil }, // state version 2 is read as it is
	2: migrateSessionRecords,
}

// checkFormat reads the file's data format: a newer one is refused, an
// older one migrated to FormatVersion, a new file marked with it.
func checkFormat(b *bolt.DB, path string, log *slog.Logger) error {
	var v uint64
	err := b.View(func(tx *bolt.Tx) error {
		var err error
		v, err = formatOf(tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	if v > FormatVersion {
		return fmt.Errorf("%w: %s is data format %d; this keyline reads formats 1 to %d", ErrNewerFormat, path, v, FormatVersion)
	}
	switch v {
	case FormatVersion:
		return nil
	case 0: // a new file
		if err := b.Update(func(tx *bolt.Tx) error { return putFormat(tx, FormatVersion) }); err != nil {
			return fmt.Errorf("persistence: %s: record the data format: %w", path, err)
		}
		return nil
	}
	for ; v < FormatVersion; v++ {
		err := b.Update(func(tx *bolt.Tx) error {
			if err := migrations[v](tx, log); err != nil {
				return err
			}
			return putFormat(tx, v+1)
		})
		if err != nil {
			return fmt.Errorf("persistence: %s: migrate data format %d to %d: %w", path, v, v+1, err)
		}
	}
	return nil
}

// formatOf returns the data format the file records: FormatVersion for a
// file that holds nothing yet, 1 for one written before formats had a number.
func formatOf(tx *bolt.Tx) (uint64, error) {
	if mb := tx.Bucket(metaBucket); mb != nil {
		raw := mb.Get(formatKey)
		v, n := binary.Uvarint(raw)
		if n <= 0 || n != len(raw) || v == 0 {
			return 0, fmt.Errorf("meta/format is %x, not a format number", raw)
		}
		return v, nil
	}
	if tx.Bucket(groupsBucket) == nil && tx.Bucket(sessionsBucket) == nil {
		return 0, nil // new
	}
	return 1, nil
}

func putFormat(tx *bolt.Tx, v uint64) error {
	mb, err := tx.CreateBucketIfNotExists(metaBucket)
	if err != nil {
		return err
	}
	return mb.Put(formatKey, binary.AppendUvarint(nil, v))
}

// The buckets of format 2's session records.
var (
	legacyClients       = []byte("clients")
	legacySubscriptions = []byte("subscriptions")
)

// migrateSessionRecords turns format 2's session records (a JSON
// storage.Client per client in sessions/clients, a JSON
// storage.Subscription per subscription in sessions/subscriptions, keyed
// by the client's uvarint-length-prefixed id then the filter) into one
// format 3 record per client, and removes the old buckets. A record that
// cannot be read is logged and dropped, as the code reading format 2 did,
// and so are subscriptions of no stored client (mochi restored nothing of
// them either). In-flight messages, outboxes and key filters keep their
// format.
func migrateSessionRecords(tx *bolt.Tx, log *slog.Logger) error {
	root := tx.Bucket(sessionsBucket)
	if root == nil {
		return nil
	}
	recs, err := root.CreateBucketIfNotExists([]byte(KindRecords))
	if err != nil {
		return err
	}
	subs := map[string][][]byte{}
	if sb := root.Bucket(legacySubscriptions); sb != nil {
		if err := sb.ForEach(func(k, v []byte) error {
			n, w := binary.Uvarint(k)
			if w <= 0 || n > uint64(len(k)-w) {
				log.Error("persistence: migrating sessions: dropping a subscription under an unreadable key", "key", fmt.Sprintf("%q", k))
				return nil
			}
			id := string(k[w : w+int(n)])
			subs[id] = append(subs[id], bytes.Clone(v))
			return nil
		}); err != nil {
			return err
		}
	}
	migrated := 0
	if cb := root.Bucket(legacyClients); cb != nil {
		if err := cb.ForEach(func(k, v []byte) error {
			id := string(k)
			state, err := sessionstate.FromJSON(v, subs[id])
			delete(subs, id)
			if err != nil {
				log.Error("persistence: migrating sessions: dropping an unreadable session", "client", id, "error", err)
				return nil
			}
			rev, err := recs.NextSequence()
			if err != nil {
				return err
			}
			migrated++
			return recs.Put(k, sessionrec.Encode(&sessionstore.Record{ClientID: id, Persistent: true, State: state}, rev))
		}); err != nil {
			return err
		}
	}
	for id, ss := range subs {
		log.Warn("persistence: migrating sessions: dropping subscriptions of no stored client", "client", id, "subscriptions", len(ss))
	}
	for _, name := range [][]byte{legacyClients, legacySubscriptions} {
		if root.Bucket(name) != nil {
			if err := root.DeleteBucket(name); err != nil {
				return err
			}
		}
	}
	log.Info("persistence: session records converted to data format 3", "sessions", migrated)
	return nil
}
