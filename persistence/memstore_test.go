package persistence

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/notify"
	"github.com/keyline-mq/keyline/keyshared"
)

// MemGroups is an in-memory GroupStore with the same behaviour as the durable
// one (limits, offsets, resolutions, dead letters, callbacks), minus
// durability: for tests, and as the reference the store suite checks both
// against. Messages are kept encoded, so the byte limits count the same sizes.
type MemGroups struct {
	mu struct {
		sync.Mutex
		groups map[string]*memGroup
		closed bool
	}
	onAppend    atomic.Pointer[func(group string, head uint64)]
	onCommitted atomic.Pointer[func()]
	notify      *notify.Notifier
}

type memGroup struct {
	meta groupMeta
	// msgs holds the unresolved messages by offset; order lists their
	// offsets ascending (resolved ones are dropped from its front lazily).
	msgs   map[uint64][]byte
	order  []uint64
	bytes  uint64
	head   uint64
	cursor uint64 // every offset <= cursor is resolved
	// dropped counts offsets the drop-oldest policy resolved; rejected the
	// appends refused at a limit.
	dropped, rejected uint64
	// dlq holds encoded dead letters by id; dlIDs lists the ids in ascending order.
	dlq      map[uint64][]byte
	dlIDs    []uint64
	dlSeq    uint64
	members  int
	lastSeen int64
	active   bool
}

var _ GroupStore = (*MemGroups)(nil)

// NewMemGroups returns an empty in-memory store. Close stops its callback goroutine.
func NewMemGroups() *MemGroups {
	s := &MemGroups{notify: notify.New()}
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
		s.notify.Close(true)
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
	shareName, filter, err := splitGroupName(name)
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
		meta:     groupMeta{Share: shareName, Filter: filter, Created: now, Config: cfg},
		msgs:     make(map[uint64][]byte),
		dlq:      make(map[uint64][]byte),
		lastSeen: timeNanos(now),
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

func (g *memGroup) info(name string) GroupInfo {
	return GroupInfo{
		Name: name, Share: g.meta.Share, Filter: g.meta.Filter, Created: g.meta.Created, Config: g.meta.Config,
		Head: g.head, Cursor: g.cursor, Backlog: uint64(len(g.msgs)),
		StoredMessages: uint64(len(g.msgs)), StoredBytes: g.bytes,
		Dropped: g.dropped, Rejected: g.rejected, DeadLetters: uint64(len(g.dlIDs)),
		Members: g.members, LastSeen: timeFromNanos(g.lastSeen),
	}
}

// Group implements GroupStore.
func (s *MemGroups) Group(name string) (GroupInfo, error) {
	g, err := s.lockGroup(name)
	if err != nil {
		return GroupInfo{}, err
	}
	defer s.mu.Unlock()
	return g.info(name), nil
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
		out = append(out, g.info(name))
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
	return &memLog{s: s, name: name}, nil
}

// OnAppend implements GroupStore.
func (s *MemGroups) OnAppend(fn func(group string, head uint64)) { s.onAppend.Store(&fn) }

// OnCommitted implements GroupStore: each append is a commit of its own.
func (s *MemGroups) OnCommitted(fn func()) { s.onCommitted.Store(&fn) }

// resolveLocked resolves off; drop counts it as dropped by the policy.
func (g *memGroup) resolveLocked(off uint64, drop bool) {
	enc, ok := g.msgs[off]
	if !ok {
		return
	}
	delete(g.msgs, off)
	g.bytes -= uint64(len(enc))
	if drop {
		g.dropped++
	}
	for len(g.order) > 0 {
		if _, live := g.msgs[g.order[0]]; live {
			break
		}
		g.order = g.order[1:]
	}
	if len(g.order) == 0 {
		g.cursor, g.order = g.head, nil
	} else {
		g.cursor = g.order[0] - 1
	}
}

// appendLocked applies the group's limits and appends enc.
func (g *memGroup) appendLocked(name string, enc []byte) (uint64, error) {
	lim, size := g.meta.Config.Limits(), uint64(len(enc))
	over := func() bool { return lim.Over(uint64(len(g.msgs)), g.bytes, size) }
	if lim.TooLarge(size) {
		g.rejected++
		return 0, fmt.Errorf("%w: group %q: message of %d bytes exceeds the limit of %d bytes", ErrBacklogFull, name, size, lim.MaxBytes)
	}
	if over() {
		if !lim.DropOldest {
			g.rejected++
			return 0, fmt.Errorf("%w: group %q holds %d messages, %d bytes (limits %d messages, %d bytes)",
				ErrBacklogFull, name, len(g.msgs), g.bytes, lim.MaxMessages, lim.MaxBytes)
		}
		for len(g.order) > 0 && over() {
			g.resolveLocked(g.order[0], true)
		}
	}
	g.head++
	g.msgs[g.head] = enc
	g.order = append(g.order, g.head)
	g.bytes += size
	if len(g.msgs) == 1 {
		g.cursor = g.head - 1
	}
	return g.head, nil
}

// appendLocked appends enc to groups and fills res. It queues the callback
// done (if any) and then the append notifications on the notifier, so that
// they run after those of earlier appends.
func (s *MemGroups) appendLocked(groups []string, enc []byte, res []AppendResult, done func([]AppendResult)) {
	type head struct {
		group string
		head  uint64
	}
	var heads []head
	for i, name := range groups {
		res[i] = AppendResult{Group: name}
		g := s.mu.groups[name]
		if g == nil {
			res[i].Err = groupNotFound(name)
			continue
		}
		res[i].Offset, res[i].Err = g.appendLocked(name, enc)
		if res[i].Err == nil {
			heads = append(heads, head{name, res[i].Offset})
		}
	}
	if done != nil {
		s.notify.Push(func() { done(res) })
	}
	if fn := s.onAppend.Load(); fn != nil && *fn != nil && len(heads) > 0 {
		s.notify.Push(func() {
			for _, h := range heads {
				(*fn)(h.group, h.head)
			}
		})
	}
	if fn := s.onCommitted.Load(); fn != nil && *fn != nil {
		s.notify.Push(*fn)
	}
}

func (s *MemGroups) appendMulti(groups []string, m *keyshared.Message, done func([]AppendResult)) []AppendResult {
	enc := keyshared.EncodeMessage(m)
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

// memLog is one group's keyshared.Log over a MemGroups.
type memLog struct {
	s    *MemGroups
	name string
}

func (l *memLog) ReadFrom(from uint64, max int, buf []keyshared.Message) ([]keyshared.Message, error) {
	g, err := l.s.lockGroup(l.name)
	if err != nil {
		return buf, err
	}
	defer l.s.mu.Unlock()
	i, _ := slices.BinarySearch(g.order, from)
	for ; i < len(g.order) && max > 0; i++ {
		enc, live := g.msgs[g.order[i]]
		if !live {
			continue
		}
		m, err := keyshared.DecodeMessage(enc, false)
		if err != nil {
			return buf, fmt.Errorf("%w: group %q offset %d: %w", ErrCorrupt, l.name, g.order[i], err)
		}
		m.Offset = g.order[i]
		buf = append(buf, m)
		max--
	}
	return buf, nil
}

func (l *memLog) Head() uint64 {
	g, err := l.s.lockGroup(l.name)
	if err != nil {
		return 0
	}
	defer l.s.mu.Unlock()
	return g.head
}

func (l *memLog) LoadCursor() (uint64, error) {
	g, err := l.s.lockGroup(l.name)
	if err != nil {
		return 0, err
	}
	defer l.s.mu.Unlock()
	return g.cursor, nil
}

func (l *memLog) Resolve(offsets []uint64) {
	g, err := l.s.lockGroup(l.name)
	if err != nil {
		return
	}
	defer l.s.mu.Unlock()
	for _, o := range offsets {
		g.resolveLocked(o, false)
	}
}

func (l *memLog) DeadLetter(d keyshared.DeadLetter) error {
	d.Group = l.name
	v := keyshared.AppendDeadLetter(nil, &d)
	g, err := l.s.lockGroup(l.name)
	if err != nil {
		return err
	}
	defer l.s.mu.Unlock()
	g.dlSeq++
	g.dlq[g.dlSeq] = v
	g.dlIDs = append(g.dlIDs, g.dlSeq)
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
		e, err := decodeDeadLetterEntry(name, be64(id), g.dlq[id])
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
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
	return decodeDeadLetterEntry(name, be64(id), v)
}

func (g *memGroup) removeDeadLetterLocked(id uint64) {
	delete(g.dlq, id)
	if i, ok := slices.BinarySearch(g.dlIDs, id); ok {
		g.dlIDs = slices.Delete(g.dlIDs, i, i+1)
	}
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
	_, enc, err := keyshared.DecodeDeadLetter(v, false)
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
	g.dlIDs = nil
	return n, nil
}

// MembersChanged implements GroupStore.
func (s *MemGroups) MembersChanged(name string, members int, now time.Time) error {
	g, err := s.lockGroup(name)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	g.members = max(members, 0)
	if active := members > 0; active != g.active {
		g.active, g.lastSeen = active, timeNanos(now)
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
		if g.members == 0 && len(g.msgs) == 0 && len(g.dlIDs) == 0 && now.Sub(timeFromNanos(g.lastSeen)) >= ttl && !internalGroup(name) {
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
	s.mu.Unlock()
	ch := make(chan struct{})
	s.notify.Push(func() { close(ch) })
	<-ch
	return nil
}
