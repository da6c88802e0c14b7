package hooks

import (
	"errors"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// sessionTable is the one owner of which copy of a session this node holds,
// per client id. A copy (*clusterSession) stands for one connection and the
// record revisions its node wrote for it: it is installed once, replaced by
// the next copy or removed, and never bound to another connection. Whatever
// acts on a copy (a disconnect, a refused record write, a release request)
// acts only while that copy is the installed one, so it never reaches the
// connection that took the session over on this node meanwhile.
//
// Release requests and announcements from other nodes name a record
// revision upTo: a copy at upTo or older is stale. One can arrive while
// this node is between writing its copy's first record and installing it;
// pending keeps the highest upTo heard for ids with an acquisition under
// way, and an acquisition whose revision it covers has lost the session
// (found by TestClusterConcurrentConnectsOneOwner: without it two nodes
// each kept a live connection for one client id).
type sessionTable struct {
	mu       sync.Mutex
	sessions map[string]*clusterSession // client id -> installed copy
	pending  map[string]*pendingAcquire // client id -> acquisitions under way here
}

type pendingAcquire struct {
	n    int    // acquisitions of the id under way on this node
	upTo uint64 // highest revision a release or announcement named meanwhile
}

// Why an acquisition could not install its copy.
var (
	// errSuperseded: another node read the revision this node wrote and
	// took the session over; this node's connection loses it.
	errSuperseded = errors.New("hooks: session taken over by another node while connecting")
	// errTableChanged: the local copy the acquisition started from was
	// released or replaced meanwhile; it starts over.
	errTableChanged = errors.New("hooks: local session copy changed while connecting")
)

func newSessionTable() *sessionTable {
	return &sessionTable{sessions: map[string]*clusterSession{}, pending: map[string]*pendingAcquire{}}
}

// get returns the installed copy of id, or nil.
func (t *sessionTable) get(id string) *clusterSession {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sessions[id]
}

// current returns the installed copy held for cl, or nil (a client taken
// over, a placeholder, or not a session of ours).
func (t *sessionTable) current(cl *mqtt.Client) *clusterSession {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.sessions[cl.ID]; s != nil && s.client == cl {
		return s
	}
	return nil
}

// begin and end bracket an acquisition of id on this node.
func (t *sessionTable) begin(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pending[id]
	if p == nil {
		p = &pendingAcquire{}
		t.pending[id] = p
	}
	p.n++
}

func (t *sessionTable) end(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pending[id]; p != nil {
		if p.n--; p.n <= 0 {
			delete(t.pending, id)
		}
	}
}

// install makes s (its record revision set) the installed copy of its id
// if prev still is (nil: none). It fails with errSuperseded when a release
// or announcement heard during the acquisition covers s's revision.
func (t *sessionTable) install(s, prev *clusterSession) error {
	rev := s.revision()
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pending[s.id]; p != nil && p.upTo >= rev {
		return errSuperseded
	}
	if t.sessions[s.id] != prev {
		return errTableChanged
	}
	t.sessions[s.id] = s
	return nil
}

// claim removes and returns the copy of id if it is at revision upTo or
// older (another node is taking it over from that revision); newer reports
// a copy kept because it is newer. An acquisition under way for id learns
// of upTo.
func (t *sessionTable) claim(id string, upTo uint64) (s *clusterSession, newer bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pending[id]; p != nil {
		p.upTo = max(p.upTo, upTo)
	}
	s = t.sessions[id]
	if s == nil {
		return nil, false
	}
	if s.revision() > upTo {
		return nil, true
	}
	delete(t.sessions, id)
	return s, false
}

// remove uninstalls s if it is the installed copy of its id.
func (t *sessionTable) remove(s *clusterSession) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[s.id] != s {
		return false
	}
	delete(t.sessions, s.id)
	return true
}

// removeStale uninstalls s after one of its record writes was refused,
// unless an acquisition of its id is under way here: then the refusal may
// come from that acquisition's own write, and the acquisition replaces s.
func (t *sessionTable) removeStale(s *clusterSession) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[s.id] != s || t.pending[s.id] != nil {
		return false
	}
	delete(t.sessions, s.id)
	return true
}

// all returns every installed copy.
func (t *sessionTable) all() []*clusterSession {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*clusterSession, 0, len(t.sessions))
	for _, s := range t.sessions {
		out = append(out, s)
	}
	return out
}

// locked calls fn with the table locked and a lookup of installed copies
// (fn must not call the table).
func (t *sessionTable) locked(fn func(get func(id string) *clusterSession)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fn(func(id string) *clusterSession { return t.sessions[id] })
}
