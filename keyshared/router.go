package keyshared

import (
	"sync"
	"sync/atomic"
)

// Router is the non-reliable (QoS 0) variant of Key-Shared dispatch: it
// routes each message on the hash ring to the one member owning its key and
// hands it over at once, on the caller's goroutine. There is no window, no
// ack, no retry and no cursor; a message the member refuses is dropped and
// counted. Route never blocks and never allocates; membership changes copy
// the ring (they are rare), so routing needs no lock. Nothing waits for a
// disconnected member here: remove it when its client goes away.
type Router struct {
	out  Deliverer
	ring atomic.Pointer[ring]

	mu struct {
		sync.Mutex
		members map[string]ringMember
	}

	delivered atomic.Uint64
	dropped   atomic.Uint64
	skipped   atomic.Uint64
}

// RouterStats count a Router's messages since it was created.
type RouterStats struct {
	Members   int
	Delivered uint64
	// Dropped counts messages the owning member refused.
	Dropped uint64
	// Skipped counts messages no member could take: the group had no member,
	// or no member's key filters matched the key.
	Skipped uint64
}

// NewRouter returns a Router with no members that delivers through out.
func NewRouter(out Deliverer) *Router {
	r := &Router{out: out}
	r.mu.members = make(map[string]ringMember)
	r.ring.Store(buildRing(nil))
	return r
}

// AddMember adds or updates a member, its key filters and its read access
// (MemberOptions.ReceiveMaximum does not apply here).
func (r *Router) AddMember(id string, o MemberOptions) error {
	if id == "" {
		return ErrInvalidMember
	}
	fs, err := compileFilters(o.KeyFilters)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.members[id] = ringMember{id: id, filters: fs, canRead: o.CanRead, fits: o.Fits}
	r.rebuildLocked()
	return nil
}

// RemoveMember removes a member; unknown ids return ErrUnknownMember.
func (r *Router) RemoveMember(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.mu.members[id]; !ok {
		return ErrUnknownMember
	}
	delete(r.mu.members, id)
	r.rebuildLocked()
	return nil
}

func (r *Router) rebuildLocked() {
	rms := make([]ringMember, 0, len(r.mu.members))
	for _, m := range r.mu.members {
		rms = append(rms, m)
	}
	r.ring.Store(buildRing(rms))
}

// Route delivers m to the member owning m.Key and returns that member's id
// and whether it took the message. With no eligible member it returns ("",
// false) and counts the message as skipped; a refusal counts as dropped.
func (r *Router) Route(m *Message) (string, bool) {
	rg := r.ring.Load()
	i := rg.pickMessage(m)
	if i < 0 {
		r.skipped.Add(1)
		return "", false
	}
	id := rg.members[i].id
	if !r.out.Deliver(id, m, 1) {
		r.dropped.Add(1)
		return id, false
	}
	r.delivered.Add(1)
	return id, true
}

// Stats returns the Router's counters.
func (r *Router) Stats() RouterStats {
	return RouterStats{
		Members:   len(r.ring.Load().members),
		Delivered: r.delivered.Load(),
		Dropped:   r.dropped.Load(),
		Skipped:   r.skipped.Load(),
	}
}
