package hooks

import (
	"slices"
	"sync"
)

// membership is one client's subscription to one group.
type membership struct {
	qos        byte     // granted QoS
	keyFilters []string // none: every key
	// subID is the subscription's MQTT 5 Subscription Identifier (0: none):
	// every delivery of the group to the member carries it [MQTT-3.3.4-3].
	subID int
}

// memberships owns who is a member of which group, from the hook's side (the
// subscriptions mochi granted); each group's dispatcher keeps its own view of
// live members. Both directions are indexed, so counting a group's members
// costs nothing and a session with many groups resumes in linear time. It is
// safe for concurrent use.
type memberships struct {
	mu       sync.Mutex
	byClient map[string]map[string]*membership // client id -> group name -> membership
	byGroup  map[string]map[string]struct{}    // group name -> client ids
}

func newMemberships() *memberships {
	return &memberships{byClient: map[string]map[string]*membership{}, byGroup: map[string]map[string]struct{}{}}
}

// set records client as a member of group and returns the group's member count.
func (ms *memberships) set(client, group string, m *membership) int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	gs := ms.byClient[client]
	if gs == nil {
		gs = map[string]*membership{}
		ms.byClient[client] = gs
	}
	gs[group] = m
	cs := ms.byGroup[group]
	if cs == nil {
		cs = map[string]struct{}{}
		ms.byGroup[group] = cs
	}
	cs[client] = struct{}{}
	return len(cs)
}

// remove forgets client's membership of group and returns the group's member
// count and whether client was a member.
func (ms *memberships) remove(client, group string) (int, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	gs := ms.byClient[client]
	if _, ok := gs[group]; !ok {
		return len(ms.byGroup[group]), false
	}
	delete(gs, group)
	if len(gs) == 0 {
		delete(ms.byClient, client)
	}
	cs := ms.byGroup[group]
	delete(cs, client)
	if len(cs) == 0 {
		delete(ms.byGroup, group)
	}
	return len(cs), true
}

// get returns client's membership of group, or nil.
func (ms *memberships) get(client, group string) *membership {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.byClient[client][group]
}

// of returns a copy of client's memberships by group name.
func (ms *memberships) of(client string) map[string]*membership {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make(map[string]*membership, len(ms.byClient[client]))
	for g, m := range ms.byClient[client] {
		out[g] = m
	}
	return out
}

// count returns the number of members of group.
func (ms *memberships) count(group string) int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return len(ms.byGroup[group])
}

// ids returns the members of group, sorted.
func (ms *memberships) ids(group string) []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make([]string, 0, len(ms.byGroup[group]))
	for c := range ms.byGroup[group] {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// groupsOfClients returns how many groups client is a member of.
func (ms *memberships) groupsOf(client string) int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return len(ms.byClient[client])
}
