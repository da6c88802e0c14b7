package hooks

import (
	"sync"
	"sync/atomic"
)

// inflightTable owns the Key-Shared deliveries awaiting a member's answer:
// which group and offset each (client, packet id) stands for, and back. It is
// safe for concurrent use.
type inflightTable struct {
	mu       sync.Mutex
	byPacket map[packetKey]delivery // (client, packet id) -> delivery
	byOffset map[offsetKey]uint16   // (group, client, offset) -> packet id
	n        atomic.Int64           // len(byPacket), read without the lock
}

type packetKey struct {
	client string
	id     uint16
}

type offsetKey struct {
	group, client string
	offset        uint64
}

// delivery is what one packet id of a member stands for.
type delivery struct {
	group  *ksGroup
	offset uint64
}

func newInflightTable() *inflightTable {
	return &inflightTable{byPacket: map[packetKey]delivery{}, byOffset: map[offsetKey]uint16{}}
}

// track records that packet id of client carries offset of g.
func (t *inflightTable) track(client string, id uint16, g *ksGroup, offset uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byPacket[packetKey{client, id}] = delivery{group: g, offset: offset}
	t.n.Store(int64(len(t.byPacket)))
	t.byOffset[offsetKey{g.name, client, offset}] = id
}

// untrack forgets packet id of client and returns what it carried.
func (t *inflightTable) untrack(client string, id uint16) (delivery, bool) {
	if t.n.Load() == 0 {
		return delivery{}, false // every client's acknowledgements pass here: no lock when idle
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.byPacket[packetKey{client, id}]
	if ok {
		delete(t.byPacket, packetKey{client, id})
		delete(t.byOffset, offsetKey{d.group.name, client, d.offset})
		t.n.Store(int64(len(t.byPacket)))
	}
	return d, ok
}

// revoke forgets the delivery of offset of group to client and returns its packet id.
func (t *inflightTable) revoke(group, client string, offset uint64) (uint16, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := offsetKey{group, client, offset}
	id, ok := t.byOffset[k]
	if ok {
		delete(t.byOffset, k)
		delete(t.byPacket, packetKey{client, id})
		t.n.Store(int64(len(t.byPacket)))
	}
	return id, ok
}

// owns reports whether packet id of client is a Key-Shared delivery.
func (t *inflightTable) owns(client string, id uint16) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.byPacket[packetKey{client, id}]
	return ok
}
