// Package sessionrec is the one binary codec of a session record
// (sessionstore.Record), for every store that keeps records as bytes: one
// node's data file (persistence.SessionRecords, bbolt, keyed by client id)
// and the cluster's JetStream bucket KL_SESSIONS (keyed by a hash of the
// client id, so the record carries the id itself).
//
// A record is, in this order (integers as varints, strings and slices
// with a uvarint length):
//
//	version          1 byte, Version
//	revision         uvarint: the data file's revision of the record; 0 in
//	                 the cluster, whose bucket keeps revisions itself
//	flags            1 byte: Persistent, Connected, and whether the client
//	                 id follows; any other bit is refused (ErrCorrupt)
//	client id        string, only with its flag (EncodeWithID)
//	owner            string
//	floor            uvarint
//	acked            uvarint count, then each sequence as a uvarint
//	disconnected at  varint (unix seconds)
//	state            the rest of the record
//
// The data file's records (data format 3) are the form without the id, and
// their bytes must not change: a data directory written by any keyline
// since format 3 opens as it is (TestStoredBytes holds them).
package sessionrec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/keyline-mq/keyline/internal/wire"
	"github.com/keyline-mq/keyline/sessionstore"
)

// Version is the first byte of an encoded record.
const Version = 1

// The flag bits of a record.
const (
	flagPersistent = 1 << iota
	flagConnected
	flagID // the client id follows the flags
)

// knownFlags are the flag bits this codec reads; a record with any other
// is refused, not misread.
const knownFlags = flagPersistent | flagConnected | flagID

// ErrCorrupt is wrapped by every error about a record that cannot be
// decoded: cut off, damaged, of another version, or with flags this
// keyline does not know.
var ErrCorrupt = errors.New("sessionrec: session record cannot be decoded")

// Encode encodes rec at revision rev without its client id (the key the
// record is stored under is the id).
func Encode(rec *sessionstore.Record, rev uint64) []byte { return encode(rec, rev, false) }

// EncodeWithID encodes rec at revision rev with its client id, for a
// store whose key is not the id.
func EncodeWithID(rec *sessionstore.Record, rev uint64) []byte { return encode(rec, rev, true) }

func encode(rec *sessionstore.Record, rev uint64, withID bool) []byte {
	size := 24 + len(rec.Owner) + 5*len(rec.Acked) + len(rec.State)
	if withID {
		size += 2 + len(rec.ClientID)
	}
	b := make([]byte, 0, size)
	b = append(b, Version)
	b = binary.AppendUvarint(b, rev)
	var flags byte
	if rec.Persistent {
		flags |= flagPersistent
	}
	if rec.Connected {
		flags |= flagConnected
	}
	if withID {
		flags |= flagID
	}
	b = append(b, flags)
	if withID {
		b = wire.AppendString(b, rec.ClientID)
	}
	b = wire.AppendString(b, rec.Owner)
	b = binary.AppendUvarint(b, rec.Floor)
	b = binary.AppendUvarint(b, uint64(len(rec.Acked)))
	for _, a := range rec.Acked {
		b = binary.AppendUvarint(b, a)
	}
	b = binary.AppendVarint(b, rec.DisconnectedAt)
	return append(b, rec.State...)
}

// Revision returns the revision an encoded record carries (0: none, or
// not a record).
func Revision(v []byte) uint64 {
	if len(v) < 2 || v[0] != Version {
		return 0
	}
	rev, n := binary.Uvarint(v[1:])
	if n <= 0 {
		return 0
	}
	return rev
}

// Decode decodes a record stored under client id, in either form: a
// record that carries its own id is that id's (a caller that keys records
// by id compares it). The result shares no memory with v.
func Decode(id string, v []byte) (*sessionstore.Record, uint64, error) {
	return decode(id, v, false)
}

// DecodeWithID decodes a record that must carry its client id (one
// EncodeWithID wrote).
func DecodeWithID(v []byte) (*sessionstore.Record, uint64, error) {
	return decode("", v, true)
}

func decode(id string, v []byte, needID bool) (*sessionstore.Record, uint64, error) {
	d := wire.NewDecoder(v, ErrCorrupt)
	if d.Byte() != Version {
		d.Fail("version")
	}
	rev := d.Uvarint()
	flags := d.Byte()
	if flags&^knownFlags != 0 || needID && flags&flagID == 0 {
		d.Fail("flags")
	}
	rec := &sessionstore.Record{ClientID: id, Persistent: flags&flagPersistent != 0, Connected: flags&flagConnected != 0}
	if flags&flagID != 0 {
		rec.ClientID = d.String()
	}
	rec.Owner = d.String()
	rec.Floor = d.Uvarint()
	if n := d.Count(); n > 0 {
		rec.Acked = make([]uint64, n)
		for i := range rec.Acked {
			rec.Acked[i] = d.Uvarint()
		}
	}
	rec.DisconnectedAt = d.Varint()
	if rest := d.Rest(); len(rest) > 0 {
		rec.State = bytes.Clone(rest)
	}
	if err := d.Err(); err != nil {
		return nil, 0, err
	}
	return rec, rev, nil
}

// Unreadable collects the records a store's ForEach could not decode and
// went past (one damaged record must not hide every other session): the
// error ForEach returns at the end names the first and counts the rest.
// The zero value is ready to use.
type Unreadable struct {
	n     int
	first error
}

// Add records a record that could not be decoded; err names it (its key)
// and wraps ErrCorrupt.
func (u *Unreadable) Add(err error) {
	if u.n == 0 {
		u.first = err
	}
	u.n++
}

// Err returns nil when every record decoded, else the first error, with
// how many more there were.
func (u *Unreadable) Err() error {
	switch u.n {
	case 0:
		return nil
	case 1:
		return u.first
	}
	return fmt.Errorf("%w (and %d more session records that cannot be decoded)", u.first, u.n-1)
}
