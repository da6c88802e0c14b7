package persistence

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
)

// MemGroups is an in-memory GroupStore with the same behaviour as the bbolt
// one (limits, offsets, dead letters, callbacks), minus durability: for tests
// and for running without a data directory. Entries are kept encoded, so the
// byte limits count the same sizes.
type MemGroups struct {
	mu struct {
		sync.Mutex
		groups map[string]*memGroup
		closed bool
	}
	onAppend atomic.Pointer[func(group string, head uint64)]
	notify   *notifier
}

type memGroup struct {
	meta groupMeta
	st   groupState
	// log holds offsets st.first.. st.head: log[i] is offset st.first+i.
	log [][]byte
	// dlq holds encoded dead letters by id; dlIDs lists the ids in ascending order.
	dlq   map[uint64][]byte
	dlIDs []uint64
}

var _ GroupStore = (*MemGroups)(nil)

// NewMemGroups returns an empty in-memory store. Close stops its callback goroutine.
func NewMemGroups() *MemGroups {
	s := &MemGroups{notify: newNotifier()}
	s.mu.groups = make(map[string]*memGroup)
	return s
}

// Close stops the store after running the callbacks already due.
func (s *MemGroups) Close() error {
	s.mu.Lock()
	already := s.mu.closed
	s.mu.closed = true
	s.mu.Unlock()
	if !already {
		s.notify.close()
	}
	return nil
}

// lockGroup locks the store and returns the group; on error the store is unlocked.
func (s *MemGroups) lockGroup(name string) (*memGroup, error) {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	g := s.mu.groups[name]
	if g == nil {
		s.mu.Unlock()
		return nil, groupNotFound(name)
	}
	return g, nil
}

// EnsureGroup implements GroupStore.
func (s *MemGroups) EnsureGroup(name string, cfg GroupConfig) (bool, error) {
	share, filter, err := splitGroupName(name)
	if err != nil {
		return false, err
	}
	if err := cfg.Validate(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return false, ErrClosed
	}
	if g := s.mu.groups[name]; g != nil {
		g.meta.Config = cfg
		return false, nil
	}
	now := time.Now()
	s.mu.groups[name] = &memGroup{
		meta: groupMeta{Share: share, Filter: filter, Created: now, Config: cfg},
		st:   newGroupState(now),
		dlq:  make(map[uint64][]byte),
	}
	return true, nil
}

// DeleteGroup implements GroupStore.
func (s *MemGroups) DeleteGroup(name string) error {
	if _, err := s.lockGroup(name); err != nil {
		return err
	}
	defer s.mu.Unlock()
	delete(s.mu.groups, name)
	return nil
}

// Group implements GroupStore.
func (s *MemGroups) Group(name string) (GroupInfo, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return GroupInfo{}, err
	}
	defer s.mu.Unlock()
	return g.st.info(name, &g.meta), nil
}

// Groups implements GroupStore.
func (s *MemGroups) Groups() ([]GroupInfo, error) {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	out := make([]GroupInfo, 0, len(s.mu.groups))
	for name, g := range s.mu.groups {
		out = append(out, g.st.info(name, &g.meta))
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b GroupInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Log implements GroupStore.
func (s *MemGroups) Log(name string) (keyshared.Log, error) {
	if _, err := s.Group(name); err != nil {
		return nil, err
	}
	return newGroupLog(s, name)
}

// OnAppend implements GroupStore.
func (s *MemGroups) OnAppend(fn func(group string, head uint64)) { s.onAppend.Store(&fn) }

// appendLocked applies the group's limits and appends enc.
func (g *memGroup) appendLocked(name string, enc []byte) (uint64, error) {
	cfg, size := g.meta.Config, uint64(len(enc))
	if cfg.MaxBytes > 0 && size > cfg.MaxBytes {
		g.st.rejected++
		return 0, fmt.Errorf("%w: group %q: message of %d bytes exceeds the limit of %d bytes", ErrBacklogFull, name, size, cfg.MaxBytes)
	}
	if g.st.overLimit(cfg, size) {
		g.trimLocked()
		if g.st.overLimit(cfg, size) {
			if cfg.policy() == PolicyReject {
				g.st.rejected++
				return 0, fmt.Errorf("%w: group %q holds %d messages, %d bytes (limits %d messages, %d bytes)",
					ErrBacklogFull, name, g.st.pending(), g.st.bytes, cfg.MaxMessages, cfg.MaxBytes)
			}
			for g.st.msgs > 0 && g.st.overLimit(cfg, size) {
				g.deleteFirstLocked()
				g.st.dropped++
			}
		}
	}
	g.log = append(g.log, enc)
	g.st.head++
	g.st.msgs++
	g.st.bytes += size
	return g.st.head, nil
}

func (g *memGroup) deleteFirstLocked() {
	g.st.bytes -= uint64(len(g.log[0]))
	g.log[0] = nil
	g.log = g.log[1:]
	g.st.first++
	g.st.msgs--
	if len(g.log) == 0 {
		g.log = nil
	}
}

func (g *memGroup) trimLocked() {
	for g.st.trimmable() {
		g.deleteFirstLocked()
	}
}

// appendLocked appends enc to groups and fills res. It queues the callback
// done (if any) and then the append notifications on the notifier, so that
// they run after those of earlier appends.
func (s *MemGroups) appendLocked(groups []string, enc []byte, res []AppendResult, done func([]AppendResult)) {
	var heads []groupHead
	for i, name := range groups {
		res[i] = AppendResult{Group: name}
		g := s.mu.groups[name]
		if g == nil {
			res[i].Err = groupNotFound(name)
			continue
		}
		res[i].Offset, res[i].Err = g.appendLocked(name, enc)
		if res[i].Err == nil {
			heads = append(heads, groupHead{name, res[i].Offset})
		}
	}
	if done != nil {
		s.notify.push(func() { done(res) })
	}
	if fn := s.onAppend.Load(); fn != nil && *fn != nil && len(heads) > 0 {
		s.notify.push(func() {
			for _, h := range heads {
				(*fn)(h.group, h.head)
			}
		})
	}
}

func (s *MemGroups) appendMulti(groups []string, m *keyshared.Message, done func([]AppendResult)) []AppendResult {
	enc := encodeMessage(m)
	res := make([]AppendResult, len(groups))
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		for i, name := range groups {
			res[i] = AppendResult{Group: name, Err: ErrClosed}
		}
		if done != nil {
			done(res)
		}
		return res
	}
	s.appendLocked(groups, enc, res, done)
	s.mu.Unlock()
	return res
}

// Append implements GroupStore.
func (s *MemGroups) Append(group string, m keyshared.Message) (uint64, error) {
	res := s.appendMulti([]string{group}, &m, nil)
	return res[0].Offset, res[0].Err
}

// AppendAsync implements GroupStore.
func (s *MemGroups) AppendAsync(group string, m keyshared.Message, done func(offset uint64, err error)) {
	s.appendMulti([]string{group}, &m, func(res []AppendResult) { done(res[0].Offset, res[0].Err) })
}

// AppendMulti implements GroupStore.
func (s *MemGroups) AppendMulti(groups []string, m keyshared.Message) []AppendResult {
	return s.appendMulti(groups, &m, nil)
}

// AppendMultiAsync implements GroupStore.
func (s *MemGroups) AppendMultiAsync(groups []string, m keyshared.Message, done func([]AppendResult)) {
	s.appendMulti(groups, &m, done)
}

func (s *MemGroups) readFrom(name string, from uint64, max int, buf []keyshared.Message) ([]keyshared.Message, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return buf, err
	}
	defer s.mu.Unlock()
	from = maxU64(from, g.st.first)
	for off := from; off <= g.st.head && max > 0; off++ {
		m, err := decodeMessage(g.log[off-g.st.first], false)
		if err != nil {
			return buf, fmt.Errorf("%w: group %q offset %d: %w", ErrCorrupt, name, off, err)
		}
		m.Offset = off
		buf = append(buf, m)
		max--
	}
	return buf, nil
}

func maxU64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

func (s *MemGroups) head(name string) uint64 {
	g, err := s.lockGroup(name)
	if err != nil {
		return 0
	}
	defer s.mu.Unlock()
	return g.st.head
}

func (s *MemGroups) first(name string) uint64 {
	g, err := s.lockGroup(name)
	if err != nil {
		return 0
	}
	defer s.mu.Unlock()
	return g.st.first
}

func (s *MemGroups) cursor(name string) (uint64, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return g.st.cursor, nil
}

func (s *MemGroups) saveCursor(name string, c uint64) error {
	g, err := s.lockGroup(name)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if c == g.st.cursor {
		return nil
	}
	if err := g.st.checkCursor(c); err != nil {
		return fmt.Errorf("group %q: %w", name, err)
	}
	g.st.cursor = c
	g.trimLocked()
	return nil
}

func (s *MemGroups) addDeadLetter(name string, d keyshared.DeadLetter) error {
	d.Group = name
	v := appendDeadLetter(nil, &d)
	g, err := s.lockGroup(name)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	g.st.dlSeq++
	g.dlq[g.st.dlSeq] = v
	g.dlIDs = append(g.dlIDs, g.st.dlSeq)
	g.st.deadLetters++
	return nil
}

// DeadLetters implements GroupStore.
func (s *MemGroups) DeadLetters(name string, after uint64, limit int) ([]DeadLetterEntry, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	i, _ := slices.BinarySearch(g.dlIDs, after)
	var out []DeadLetterEntry
	for ; i < len(g.dlIDs) && len(out) < limit; i++ {
		id := g.dlIDs[i]
		if id <= after {
			continue
		}
		e, err := memDeadLetter(name, id, g.dlq[id])
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func memDeadLetter(group string, id uint64, v []byte) (DeadLetterEntry, error) {
	return decodeDeadLetterEntry(group, be64(id), v)
}

// DeadLetter implements GroupStore.
func (s *MemGroups) DeadLetter(name string, id uint64) (DeadLetterEntry, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return DeadLetterEntry{}, err
	}
	defer s.mu.Unlock()
	v, ok := g.dlq[id]
	if !ok {
		return DeadLetterEntry{}, fmt.Errorf("%w: group %q id %d", ErrDeadLetterNotFound, name, id)
	}
	return memDeadLetter(name, id, v)
}

func (g *memGroup) removeDeadLetterLocked(id uint64) {
	delete(g.dlq, id)
	if i, ok := slices.BinarySearch(g.dlIDs, id); ok {
		g.dlIDs = slices.Delete(g.dlIDs, i, i+1)
	}
	g.st.deadLetters--
}

// DeleteDeadLetter implements GroupStore.
func (s *MemGroups) DeleteDeadLetter(name string, id uint64) error {
	g, err := s.lockGroup(name)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, ok := g.dlq[id]; !ok {
		return fmt.Errorf("%w: group %q id %d", ErrDeadLetterNotFound, name, id)
	}
	g.removeDeadLetterLocked(id)
	return nil
}

// ReplayDeadLetter implements GroupStore.
func (s *MemGroups) ReplayDeadLetter(name string, id uint64) (uint64, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	v, ok := g.dlq[id]
	if !ok {
		return 0, fmt.Errorf("%w: group %q id %d", ErrDeadLetterNotFound, name, id)
	}
	_, enc, err := decodeDeadLetter(v, false)
	if err != nil {
		return 0, fmt.Errorf("%w: group %q dead letter %d: %w", ErrCorrupt, name, id, err)
	}
	res := make([]AppendResult, 1)
	s.appendLocked([]string{name}, enc, res, nil)
	if res[0].Err != nil {
		return 0, res[0].Err
	}
	g.removeDeadLetterLocked(id)
	return res[0].Offset, nil
}

// PurgeDeadLetters implements GroupStore.
func (s *MemGroups) PurgeDeadLetters(name string) (int, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := len(g.dlIDs)
	clear(g.dlq)
	g.dlIDs, g.st.deadLetters = nil, 0
	return n, nil
}

// MembersChanged implements GroupStore.
func (s *MemGroups) MembersChanged(name string, members int, now time.Time) error {
	g, err := s.lockGroup(name)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	g.st.members = max(members, 0)
	if active := members > 0; active != g.st.active {
		g.st.active, g.st.lastSeen = active, timeNanos(now)
	}
	return nil
}

// SweepIdle implements GroupStore.
func (s *MemGroups) SweepIdle(now time.Time, ttl time.Duration) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, ErrClosed
	}
	var swept []string
	for name, g := range s.mu.groups {
		if g.st.members == 0 && g.st.pending() == 0 && g.st.deadLetters == 0 && now.Sub(timeFromNanos(g.st.lastSeen)) >= ttl {
			swept = append(swept, name)
			delete(s.mu.groups, name)
		}
	}
	slices.Sort(swept)
	return swept, nil
}

// Flush implements GroupStore.
func (s *MemGroups) Flush() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	ch := make(chan struct{})
	s.notify.push(func() { close(ch) })
	s.mu.Unlock()
	<-ch
	return nil
}
