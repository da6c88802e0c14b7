package cluster

import (
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// subjPresence carries every node's heartbeat, to every node.
const subjPresence = Prefix + ".p"

// presenceEvery is the heartbeat period; a node silent for nodeSilent is
// suspected gone (and confirmed gone once NATS has no responder for it).
const (
	presenceEvery = 500 * time.Millisecond
	nodeSilent    = 2 * time.Second
)

type presenceMsg struct {
	Node string `json:"n"`
	Bye  bool   `json:"b,omitempty"` // the node is shutting down
}

// presence knows which nodes are alive: the ones heard from recently.
type presence struct {
	self string
	mu   struct {
		sync.Mutex
		seen  map[string]time.Time // node id -> last heartbeat
		since map[string]time.Time // node id -> when its current run of heartbeats began
		// gone: nodes silent for nodeSilent that NATS had no responder
		// for (confirmed by Groups.suspect); cleared when heard again.
		gone     map[string]bool
		checking map[string]bool
	}
}

func newPresence(self string) *presence {
	p := &presence{self: self}
	p.mu.seen = map[string]time.Time{}
	p.mu.since = map[string]time.Time{}
	p.mu.gone = map[string]bool{}
	p.mu.checking = map[string]bool{}
	return p
}

func (p *presence) heard(m *nats.Msg) {
	var pm presenceMsg
	if json.Unmarshal(m.Data, &pm) != nil || pm.Node == "" || pm.Node == p.self {
		return
	}
	if !pm.Bye {
		p.touch(pm.Node)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.mu.seen, pm.Node)
	delete(p.mu.since, pm.Node)
}

// touch records that node was heard from otherwise (a request from it).
func (p *presence) touch(node string) {
	if node == p.self || node == "" {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if last, ok := p.mu.seen[node]; !ok || now.Sub(last) > nodeSilent {
		p.mu.since[node] = now
	}
	p.mu.seen[node] = now
	delete(p.mu.gone, node)
}

// isGone reports whether node was confirmed gone (and not heard since).
func (p *presence) isGone(node string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.gone[node]
}

// live returns the nodes heard from within nodeSilent, this one included, sorted.
func (p *presence) live(now time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []string{p.self}
	for n, t := range p.mu.seen {
		if now.Sub(t) <= nodeSilent {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// isLive reports whether node was heard from within nodeSilent.
func (p *presence) isLive(node string, now time.Time) bool {
	if node == p.self {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.mu.seen[node]
	return ok && now.Sub(t) <= nodeSilent
}

// stableFor reports whether node has been live without a gap for at least d.
func (p *presence) stableFor(node string, d time.Duration, now time.Time) bool {
	if node == p.self {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.mu.seen[node]
	return ok && now.Sub(t) <= nodeSilent && now.Sub(p.mu.since[node]) >= d
}

// preferred returns the node a group's dispatcher belongs on among nodes:
// the highest rendezvous hash of (group, node). Each node computes the same
// answer from the same live set, and a node joining or leaving moves only
// the groups it wins or held.
func preferred(group string, nodes []string) string {
	var best, bestScore string
	for _, n := range nodes {
		s := hashToken(group + "\x00" + n)
		if best == "" || s > bestScore {
			best, bestScore = n, s
		}
	}
	return best
}
