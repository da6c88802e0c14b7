package persistence

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keyline-mq/keyline/internal/wire"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence/seglog"
)

// errDecode is wrapped by every decoding error (the message and dead-letter
// codec's, keyshared.ErrBadRecord, included); loading a group turns it into
// ErrCorrupt. Messages and dead letters are encoded by keyshared's codec.
var errDecode = keyshared.ErrBadRecord

const stateVersion = 3

// groupState is a group's checkpoint, stored under "state" in the group's
// bucket and rewritten by each checkpoint that changes it:
//
//	version byte (3), then uvarints: head, cursor, dropped, then varint last
//	seen, byte active, uvarint count of resolved ranges above the cursor,
//	and each as uvarint gap from the previous range's end (the cursor for
//	the first) and uvarint length - 1; then uvarint lost.
//
// Version 2 (data format 1) is the same without lost; it is read as lost 0.
// A keyline of data format 1 refuses version 3 (it reads the group as
// corrupt), so it cannot open a data dir a newer keyline wrote.
//
// The messages themselves live in the segment log (package seglog), which
// recovers the rest from the checkpoint.
type groupState struct {
	seglog.GroupState
	// lastSeen is when the group last had members, in unix nanoseconds.
	lastSeen int64
	// active records whether the group had members at the last checkpoint.
	active bool
}

func (st *groupState) encode() []byte {
	b := make([]byte, 0, 48+8*len(st.Resolved))
	b = append(b, stateVersion)
	for _, v := range [...]uint64{st.Head, st.Cursor, st.Dropped} {
		b = binary.AppendUvarint(b, v)
	}
	b = binary.AppendVarint(b, st.lastSeen)
	if st.active {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(st.Resolved)))
	prev := st.Cursor
	for _, r := range st.Resolved {
		b = binary.AppendUvarint(b, r.First-prev)
		b = binary.AppendUvarint(b, r.Last-r.First)
		prev = r.Last
	}
	return binary.AppendUvarint(b, st.Lost)
}

func decodeState(buf []byte) (groupState, error) {
	d := wire.NewDecoder(buf, errDecode)
	var st groupState
	v := d.Byte()
	if v != stateVersion && v != 2 {
		if d.Err() != nil {
			return st, d.Err()
		}
		if v == 1 {
			return st, fmt.Errorf("%w: state version 1: written by an earlier keyline that kept group logs in this file; start with an empty data dir", errDecode)
		}
		return st, fmt.Errorf("%w: state version %d", errDecode, v)
	}
	for _, p := range [...]*uint64{&st.Head, &st.Cursor, &st.Dropped} {
		*p = d.Uvarint()
	}
	st.lastSeen = d.Varint()
	st.active = d.Byte() == 1
	n := d.Uvarint()
	if d.Err() == nil && n > uint64(len(buf)) {
		return groupState{}, fmt.Errorf("%w: %d resolved ranges in %d bytes", errDecode, n, len(buf))
	}
	prev := st.Cursor
	for range n {
		first := prev + d.Uvarint()
		last := first + d.Uvarint()
		if d.Err() != nil {
			break
		}
		if first <= prev+1 || last > st.Head || last < first {
			return groupState{}, fmt.Errorf("%w: resolved range %d..%d after %d (head %d)", errDecode, first, last, prev, st.Head)
		}
		st.Resolved = append(st.Resolved, seglog.Range{First: first, Last: last})
		prev = last
	}
	if v >= 3 {
		st.Lost = d.Uvarint()
	}
	if d.Err() != nil {
		return groupState{}, d.Err()
	}
	if st.Cursor > st.Head {
		return groupState{}, fmt.Errorf("%w: inconsistent state head=%d cursor=%d", errDecode, st.Head, st.Cursor)
	}
	return st, nil
}

// dlqState counts a group's dead letters, stored under "dlq-state" and
// written in the transaction of every dead-letter operation:
//
//	uvarint dead letters held, uvarint last id handed out (ids are never reused)
type dlqState struct {
	count, seq uint64
}

func (d dlqState) encode() []byte {
	return binary.AppendUvarint(binary.AppendUvarint(make([]byte, 0, 20), d.count), d.seq)
}

func decodeDLQState(buf []byte) (dlqState, error) {
	d := wire.NewDecoder(buf, errDecode)
	st := dlqState{count: d.Uvarint(), seq: d.Uvarint()}
	if d.Err() != nil {
		return dlqState{}, d.Err()
	}
	if st.count > st.seq {
		return dlqState{}, fmt.Errorf("%w: %d dead letters but last id %d", errDecode, st.count, st.seq)
	}
	return st, nil
}

// groupMeta is a group's identity and settings, stored as JSON under "meta".
type groupMeta struct {
	// ID names the group in the segment log; ids are never reused.
	ID      uint64      `json:"id"`
	Share   string      `json:"share"`
	Filter  string      `json:"filter"`
	Created time.Time   `json:"created"`
	Config  GroupConfig `json:"config"`
}

func (m *groupMeta) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("persistence: encode group meta: %w", err)
	}
	return b, nil
}

func decodeMeta(buf []byte) (groupMeta, error) {
	var m groupMeta
	if err := json.Unmarshal(buf, &m); err != nil {
		return m, fmt.Errorf("%w: meta: %v", errDecode, err)
	}
	return m, nil
}

func timeNanos(t time.Time) int64     { return wire.TimeNanos(t) }
func timeFromNanos(n int64) time.Time { return wire.TimeFromNanos(n) }

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), v) }
