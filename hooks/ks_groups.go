package hooks

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
)

// ksGroup is one running Key-Shared group: this node's side of it
// (keyshared.Group), from the backend: its dispatcher runs here on one
// node, on the node holding the group's lease in a cluster.
type ksGroup struct {
	name string // "<share>/<filter>"
	n    share.Name
	d    keyshared.Group
	// owner is whom the group counts against (KeySharedConfig.GroupOwner);
	// guarded by the registry's mu.
	owner string
	// ext is where an internal group's deliveries go (ks_internal.go).
	ext atomic.Pointer[internalOut]
}

// groupRegistry owns the running groups and the index that matches topics to
// them. It is safe for concurrent use.
type groupRegistry struct {
	mu struct {
		sync.RWMutex
		groups map[string]*ksGroup // by name
		index  *mqtt.TopicsIndex   // group filters; the "client id" is the group name
		// opening holds the groups being created: a second caller waits for
		// the first instead of creating it twice, and nobody holds mu while
		// the store commits the new group.
		opening map[string]chan struct{}
		// owned counts the running groups of each owner (ksGroup.owner).
		owned map[string]int
	}
	// matches caches topic -> matching groups, valid while version is.
	matches *topicCache[[]*ksGroup]
	version atomic.Uint64 // bumped under mu.Lock whenever the index changes
}

// Bounds of the topic -> groups cache.
const (
	maxMatchEntries = 100_000
	maxMatchBytes   = 32 << 20
)

func newGroupRegistry() *groupRegistry {
	r := &groupRegistry{matches: newTopicCache[[]*ksGroup](maxMatchEntries, maxMatchBytes)}
	r.mu.groups = map[string]*ksGroup{}
	r.mu.index = mqtt.NewTopicsIndex()
	r.mu.opening = map[string]chan struct{}{}
	r.mu.owned = map[string]int{}
	return r
}

// claim makes owner the owner of group name, if it runs and has none.
func (r *groupRegistry) claim(name, owner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g := r.mu.groups[name]; g != nil && g.owner == "" {
		g.owner = owner
		r.mu.owned[owner]++
	}
}

// owned returns how many running groups owner owns.
func (r *groupRegistry) owned(owner string) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.mu.owned[owner]
}

// disownLocked stops counting g against its owner.
func (r *groupRegistry) disownLocked(g *ksGroup) {
	if g.owner == "" {
		return
	}
	if r.mu.owned[g.owner]--; r.mu.owned[g.owner] <= 0 {
		delete(r.mu.owned, g.owner)
	}
	g.owner = ""
}

func (r *groupRegistry) get(name string) *ksGroup {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.mu.groups[name]
}

// ensure returns the running group name, calling open to create it when it
// is not running. open runs without the registry's lock; concurrent callers
// for the same group wait for the first one's outcome.
func (r *groupRegistry) ensure(name string, open func() (*ksGroup, error)) (*ksGroup, error) {
	for {
		r.mu.Lock()
		if g := r.mu.groups[name]; g != nil {
			r.mu.Unlock()
			return g, nil
		}
		wait, busy := r.mu.opening[name]
		if !busy {
			done := make(chan struct{})
			r.mu.opening[name] = done
			r.mu.Unlock()
			g, err := open()
			r.mu.Lock()
			delete(r.mu.opening, name)
			if err == nil {
				r.addLocked(g)
			}
			r.mu.Unlock()
			close(done)
			return g, err
		}
		r.mu.Unlock()
		<-wait // then look again: created, or failed (and this caller tries)
	}
}

func (r *groupRegistry) addLocked(g *ksGroup) {
	r.mu.groups[g.name] = g
	r.mu.index.Subscribe(g.name, packets.Subscription{Filter: g.n.Filter})
	r.version.Add(1)
}

// remove takes a group out of the registry and returns it (nil if it was not running).
func (r *groupRegistry) remove(name string) *ksGroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.mu.groups[name]
	if g != nil {
		r.disownLocked(g)
		delete(r.mu.groups, name)
		r.mu.index.Unsubscribe(g.n.Filter, name)
		r.version.Add(1)
	}
	return g
}

// removeAll empties the registry and returns what it held.
func (r *groupRegistry) removeAll() []*ksGroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*ksGroup, 0, len(r.mu.groups))
	for name, g := range r.mu.groups {
		r.disownLocked(g)
		out = append(out, g)
		delete(r.mu.groups, name)
		r.mu.index.Unsubscribe(g.n.Filter, name)
	}
	r.version.Add(1)
	return out
}

// count returns the number of running groups.
func (r *groupRegistry) count() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.mu.groups)
}

// match returns the groups whose filter matches topic. Results are cached
// per topic: scanning the index costs more than the rest of a publish.
func (r *groupRegistry) match(topic string) []*ksGroup {
	v := r.version.Load()
	if gs, ok := r.matches.get(topic, v); ok {
		return gs
	}
	r.mu.RLock()
	subs := r.mu.index.Subscribers(topic)
	var gs []*ksGroup
	for name := range subs.Subscriptions {
		if g := r.mu.groups[name]; g != nil {
			gs = append(gs, g)
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(gs, func(a, b *ksGroup) int { return strings.Compare(a.name, b.name) })
	r.matches.put(topic, v, gs, int64(8*len(gs)))
	return gs
}
