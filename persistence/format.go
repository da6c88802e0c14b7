package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// FormatVersion is the data format of keyline.db this package writes, kept
// under meta/format. Format 1 (no meta bucket: keylines before formats had
// a number) differs only in its group checkpoints (state version 2, read as
// they are): opening it records format 2, in one transaction. The segment
// files carry their own format (seglog.FormatVersion) in their headers.
const FormatVersion = 2

// ErrNewerFormat is returned by Open for a keyline.db written in a newer
// format, by a newer keyline; nothing is changed.
var ErrNewerFormat = errors.New("persistence: data written by a newer keyline")

var (
	metaBucket = []byte("meta")
	formatKey  = []byte("format")
)

// migrations[v] turns data format v into v+1 inside one transaction (which
// records v+1), so that a crash leaves the file in one format or the other.
var migrations = map[uint64]func(tx *bolt.Tx) error{
	1: func(*bolt.Tx) error { return nil }, // state version 2 is read as it is
}

// checkFormat reads the file's data format: a newer one is refused, an
// older one migrated to FormatVersion, a new file marked with it.
func checkFormat(b *bolt.DB, path string) error {
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
			if err := migrations[v](tx); err != nil {
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
