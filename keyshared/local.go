package keyshared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// NewLocalBackend returns the Backend of a single node over store (package
// persistence: the segment log and bbolt, or memory): each group opened
// runs its dispatcher here, over the store's log of the group, and its QoS
// 0 ring here. The store learns of member counts (MembersChanged, for
// SweepIdle) from the groups' members, and appends notify the open group.
func NewLocalBackend(store GroupStore) Backend {
	b := &localBackend{GroupStore: store, open: map[string]*localGroup{}}
	store.OnAppend(b.appended)
	return b
}

type localBackend struct {
	GroupStore
	mu   sync.Mutex
	open map[string]*localGroup
}

func (b *localBackend) appended(group string, _ uint64) {
	b.mu.Lock()
	g := b.open[group]
	b.mu.Unlock()
	if g != nil {
		g.d.Notify()
	}
}

// OnCommitted implements Backend: the store tells the end of each commit.
func (b *localBackend) OnCommitted(fn func()) bool {
	b.GroupStore.OnCommitted(fn)
	return true
}

// Pending implements Backend from the store's log.
func (b *localBackend) Pending(name string, from uint64, limit int) ([]Message, error) {
	log, err := b.Log(name)
	if err != nil {
		return nil, err
	}
	return log.ReadFrom(from, limit, nil)
}

// Open implements Backend: the group's dispatcher and router, here.
func (b *localBackend) Open(name string, cfg Config, out Output) (Group, error) {
	log, err := b.Log(name)
	if err != nil {
		return nil, err
	}
	log = deadLetterOut{Log: log, out: out}
	cfg.Group = name
	g := &localGroup{b: b, name: name, log: cfg.logger(), members: map[string]MemberOptions{}}
	if g.d, err = New(cfg, log, out); err != nil {
		return nil, fmt.Errorf("keyshared: group %s: %w", name, err)
	}
	g.r = NewRouter(out)
	b.mu.Lock()
	if old := b.open[name]; old != nil {
		b.mu.Unlock()
		_ = g.d.Close(context.Background())
		return nil, fmt.Errorf("keyshared: group %s is open already", name)
	}
	b.open[name] = g
	b.mu.Unlock()
	return g, nil
}

// deadLetterOut hands each dead letter to the Output once the log stored it.
type deadLetterOut struct {
	Log
	out Output
}

func (l deadLetterOut) DeadLetter(d DeadLetter) error {
	if err := l.Log.DeadLetter(d); err != nil {
		return err
	}
	l.out.DeadLettered(d)
	return nil
}

// localGroup is a group whose dispatcher runs on this node.
type localGroup struct {
	b    *localBackend
	name string
	log  *slog.Logger
	d    *Dispatcher
	r    *Router

	mu      sync.Mutex
	members map[string]MemberOptions // added and not removed: the count the store keeps
}

func (g *localGroup) AddMember(id string, o MemberOptions) error {
	err := g.d.AddMember(id, o)
	if rerr := g.r.AddMember(id, o); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.members[id] = o
	g.countedLocked()
	g.mu.Unlock()
	return nil
}

func (g *localGroup) RemoveMember(id string) error {
	g.mu.Lock()
	_, was := g.members[id]
	delete(g.members, id)
	if was {
		g.countedLocked()
	}
	g.mu.Unlock()
	_ = g.r.RemoveMember(id)
	err := g.d.RemoveMember(id)
	if !was && err == nil {
		err = ErrUnknownMember
	}
	return err
}

// countedLocked tells the store the member count, in the order changes
// happen (two members leaving at once cannot report out of order).
func (g *localGroup) countedLocked() {
	if err := g.b.MembersChanged(g.name, len(g.members), time.Now()); err != nil && !errors.Is(err, ErrGroupNotFound) {
		g.log.Warn("keyshared: member count not recorded", "error", err)
	}
}

func (g *localGroup) SetActive(id string, active bool) error {
	if !active {
		_ = g.r.RemoveMember(id) // QoS 0 does not wait for a member that is away
	} else {
		g.mu.Lock()
		o, ok := g.members[id]
		g.mu.Unlock()
		if ok {
			_ = g.r.AddMember(id, o)
		}
	}
	return g.d.SetActive(id, active)
}

func (g *localGroup) Ack(member string, offset uint64) error { return g.d.Ack(member, offset) }
func (g *localGroup) Nack(member string, offset uint64, reason byte) error {
	return g.d.Nack(member, offset, reason)
}
func (g *localGroup) Reject(member string, offset uint64, reason byte) error {
	return g.d.Reject(member, offset, reason)
}
func (g *localGroup) Notify()                         { g.d.Notify() }
func (g *localGroup) Route(m *Message) (string, bool) { return g.r.Route(m) }
func (g *localGroup) Stats() Stats                    { return g.d.Stats() }
func (g *localGroup) RouterStats() RouterStats        { return g.r.Stats() }
func (g *localGroup) Holder() (string, bool)          { return "", true }
func (g *localGroup) HeldHere() bool                  { return true }
func (g *localGroup) States(ctx context.Context, offsets []uint64) ([]MessageStatus, error) {
	return g.d.States(ctx, offsets)
}

// Members implements Group: what AddMember was given, and whether the
// dispatcher sees the member connected.
func (g *localGroup) Members() []MemberInfo {
	active := map[string]bool{}
	for _, m := range g.d.Stats().PerMember {
		active[m.ID] = m.Active
	}
	g.mu.Lock()
	out := make([]MemberInfo, 0, len(g.members))
	for id, o := range g.members {
		out = append(out, MemberInfo{ID: id, QoS: o.QoS, KeyFilters: slices.Clone(o.KeyFilters), Connected: active[id]})
	}
	g.mu.Unlock()
	slices.SortFunc(out, func(a, b MemberInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Close implements Group: the dispatcher hands its last resolutions to the log.
func (g *localGroup) Close(ctx context.Context) error {
	g.b.mu.Lock()
	if g.b.open[g.name] == g {
		delete(g.b.open, g.name)
	}
	g.b.mu.Unlock()
	return g.d.Close(ctx)
}
