package sessionstore

import (
	"context"
	"slices"
	"strings"
	"sync"
)

// Memory is a Store in memory, for one process: what one node's tests and
// the parts of the broker that hold no state of their own use.
type Memory struct {
	mu   sync.Mutex
	rev  uint64 // last revision handed out
	recs map[string]memRecord
}

type memRecord struct {
	rec *Record
	rev uint64
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory { return &Memory{recs: map[string]memRecord{}} }

// Load returns a copy of the client's record and its revision.
func (m *Memory) Load(ctx context.Context, clientID string) (*Record, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[clientID]
	if !ok {
		return nil, 0, nil
	}
	return r.rec.Clone(), r.rev, nil
}

// Save writes a copy of rec if its record is still at rev.
func (m *Memory) Save(ctx context.Context, rec *Record, rev uint64) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs[rec.ClientID].rev != rev {
		return 0, ErrRevision
	}
	m.rev++
	m.recs[rec.ClientID] = memRecord{rec.Clone(), m.rev}
	return m.rev, nil
}

// Delete deletes the client's record if it is still at rev.
func (m *Memory) Delete(ctx context.Context, clientID string, rev uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs[clientID].rev != rev || rev == 0 {
		return ErrRevision
	}
	delete(m.recs, clientID)
	return nil
}

// ForEach calls fn with a copy of every record, by client id, until fn
// returns false; fn may call the store.
func (m *Memory) ForEach(ctx context.Context, fn func(rec *Record, rev uint64) bool) error {
	m.mu.Lock()
	all := make([]memRecord, 0, len(m.recs))
	for _, r := range m.recs {
		all = append(all, memRecord{r.rec.Clone(), r.rev})
	}
	m.mu.Unlock()
	slices.SortFunc(all, func(a, b memRecord) int { return strings.Compare(a.rec.ClientID, b.rec.ClientID) })
	for _, r := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !fn(r.rec, r.rev) {
			break
		}
	}
	return nil
}
