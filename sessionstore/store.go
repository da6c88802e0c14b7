// Package sessionstore is the seam between the broker's session hooks and
// where the records of MQTT sessions live: one interface (Store), one
// written contract (below), one test suite (sessionstore/storetest) run
// against every implementation. It knows neither mochi nor bbolt nor NATS.
package sessionstore

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
)

// ErrRevision is returned when a record changed since the writer read it
// (someone else wrote it: in a cluster, another node owns the session now).
var ErrRevision = errors.New("sessionstore: session record changed (taken over)")

// Record is one session as a Store keeps it. The broker fills State; a
// store reads nothing of it.
type Record struct {
	ClientID   string `json:"id"`
	Owner      string `json:"owner"`      // node id holding the session
	Persistent bool   `json:"persistent"` // outlives its connection
	Connected  bool   `json:"connected"`
	// Floor: every queued message at or below it that matched the session
	// was acknowledged by the client or dropped. A replay starts above it.
	Floor uint64 `json:"floor"`
	// Acked lists sequences above Floor the client has acknowledged, so a
	// replay does not send them again (bounded; losing some only costs duplicates).
	Acked          []uint64        `json:"acked,omitempty"`
	DisconnectedAt int64           `json:"disconnected_at,omitempty"` // unix seconds
	State          json.RawMessage `json:"state,omitempty"`
}

// Store keeps session records, one per client id, each with a revision.
// Writes are compare-and-set on the revision the writer read, so that of
// two writers racing for one session exactly one wins.
//
// The contract, which storetest checks against every implementation (the
// in-memory one here, one node's data file (persistence.SessionRecords,
// bbolt), the cluster's JetStream key-value bucket):
//
//   - Revisions are positive and only grow per store (deployment-wide in a
//     cluster); a record that does not exist has revision 0.
//   - Save(rec, 0) creates a record that does not exist; Save(rec, rev)
//     replaces one that is still at rev. Either returns the new revision,
//     or ErrRevision when the record is not at rev (another writer won).
//     Of concurrent Saves at one revision exactly one succeeds.
//   - Delete(id, rev) deletes a record still at rev, else ErrRevision (a
//     record written since, or already gone).
//   - What is durable when: a Save or Delete that returned nil is
//     durable (JetStream: stored on a quorum of the bucket's replicas;
//     the data file: committed and synced; memory: for the life of the
//     process) and every later write decides against it, after a restart
//     too (storetest.RunDurable, for the stores that outlive a process). A Load may lag behind a write made through another
//     store of the deployment (another node; any replica may answer),
//     never behind one made through the same store, and never returns a
//     record that was not written.
//   - Load and ForEach return copies: changing them changes nothing stored.
//   - ForEach calls fn for every record that existed for the whole call
//     (records written or deleted meanwhile may be seen or not), each with
//     its revision, until fn returns false.
//   - A stored record that cannot be decoded costs only itself: ForEach
//     goes past it, calls fn for the others and then returns an error that
//     names the first such record (its key) and wraps sessionrec.ErrCorrupt;
//     Load of it returns that error with the revision a Save replacing it
//     passes. (Callers log it and go on: one damaged record must not stop a
//     node from starting or hide the other sessions.)
//   - Callbacks: the store calls fn of ForEach on the caller's goroutine and
//     calls nothing else back; what another node does to a session it
//     learns by a failed Save (ErrRevision), not from the store.
//
// All methods are safe for concurrent use.
type Store interface {
	// Load returns the client's record and its revision: nil and 0 when
	// there is none.
	Load(ctx context.Context, clientID string) (*Record, uint64, error)
	// Save writes rec if its record's revision is still rev (0: it must
	// not exist) and returns the new revision.
	Save(ctx context.Context, rec *Record, rev uint64) (uint64, error)
	// Delete deletes the client's record if it is still at revision rev.
	Delete(ctx context.Context, clientID string, rev uint64) error
	// ForEach calls fn with every record and its revision until fn
	// returns false.
	ForEach(ctx context.Context, fn func(rec *Record, rev uint64) bool) error
}

// Clone returns a deep copy of r.
func (r *Record) Clone() *Record {
	c := *r
	c.Acked = slices.Clone(r.Acked)
	c.State = slices.Clone(r.State)
	return &c
}
