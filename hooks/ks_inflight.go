package hooks

import (
	"sync"
	"sync/atomic"
)

// inflightTable owns the Key-Shared deliveries awaiting a member's answer:
// which group and offset each (client, packet id) stands for. It is safe for
// concurrent use. Every delivery costs one lookup by client id to track and
// one to untrack (the table is on the path of every message); revoking, which
// members leaving and ack timeouts need, scans the client's deliveries.
type inflightTable struct {
	mu      sync.Mutex
	clients map[string]map[uint16]delivery // client -> packet id -> delivery; no empty inner maps
	n       atomic.Int64                   // deliveries tracked, read without the lock
}

// delivery is what one packet id of a member stands for.
type delivery struct {
	group  *ksGroup
	offset uint64
}

func newInflightTable() *inflightTable {
	return &inflightTable{clients: map[string]map[uint16]delivery{}}
}

// track records that packet id of client carries offset of g.
func (t *inflightTable) track(client string, id uint16, g *ksGroup, offset uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds := t.clients[client]
	if ds == nil {
		ds = map[uint16]delivery{}
		t.clients[client] = ds
	}
	if _, ok := ds[id]; !ok {
		t.n.Add(1)
	}
	ds[id] = delivery{group: g, offset: offset}
}

// untrack forgets packet id of client and returns what it carried.
func (t *inflightTable) untrack(client string, id uint16) (delivery, bool) {
	if t.n.Load() == 0 {
		return delivery{}, false // every client's acknowledgements pass here: no lock when idle
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ds := t.clients[client]
	d, ok := ds[id]
	if ok {
		t.forgetLocked(client, ds, id)
	}
	return d, ok
}

// revoke forgets the delivery of offset of group to client and returns its packet id.
func (t *inflightTable) revoke(group, client string, offset uint64) (uint16, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds := t.clients[client]
	for id, d := range ds {
		if d.offset == offset && d.group.name == group {
			t.forgetLocked(client, ds, id)
			return id, true
		}
	}
	return 0, false
}

func (t *inflightTable) forgetLocked(client string, ds map[uint16]delivery, id uint16) {
	delete(ds, id)
	t.n.Add(-1)
	if len(ds) == 0 {
		delete(t.clients, client) // a client gone for good leaves nothing behind
	}
}

// owns reports whether packet id of client is a Key-Shared delivery.
func (t *inflightTable) owns(client string, id uint16) bool {
	if t.n.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.clients[client][id]
	return ok
}
