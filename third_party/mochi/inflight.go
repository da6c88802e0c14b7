// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: 2023 mochi-mqtt, mochi-co
// SPDX-FileContributor: mochi-co

package mqtt

import (
	"maps"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Inflight is a map of InflightMessage keyed on packet id.
//
// Keyline's fork: packet ids are per direction [MQTT-2.2.1-3]: the server's
// publishes to the client (PUBLISH awaiting PUBACK or PUBREC, PUBREL awaiting
// PUBCOMP) and the client's QoS 2 publishes to the server (the PUBREC sent,
// awaiting PUBREL; the PUBCOMP being written) each number their own. v2.7.9
// kept both in one map, so a client's QoS 2 PUBLISH with id N overwrote the
// server's PUBLISH N waiting for its PUBACK (and any client PUBLISH N deleted
// it), and a PUBACK N could delete the PUBREC N of the other direction. The
// two directions are two maps now: Set files an entry by its type (a PUBREC or
// PUBCOMP is the server's answer to the client's publish), Get and Delete are
// the server's ids, GetInbound and DeleteInbound the client's.
type Inflight struct {
	sync.RWMutex
	internal            map[uint16]packets.Packet // the server's publishes in flight, by packet id
	inbound             map[uint16]packets.Packet // the client's QoS 2 publishes in flight (the PUBREC sent), by packet id
	receiveQuota        int32                     // remaining inbound qos quota for flow control
	sendQuota           int32                     // remaining outbound qos quota for flow control
	maximumReceiveQuota int32                     // maximum allowed receive quota
	maximumSendQuota    int32                     // maximum allowed send quota
	held                atomic.Int32              // entries of both maps, for a look without the lock (Keyline's fork)
}

// NewInflights returns a new instance of an Inflight packets map.
func NewInflights() *Inflight {
	return &Inflight{} // its maps are made by the first Set (Keyline's fork: most clients never hold one)
}

// IsInbound reports whether an in-flight entry belongs to the client's
// publishes (a PUBREC or PUBCOMP the server sent) rather than the server's.
func IsInbound(m packets.Packet) bool {
	return m.FixedHeader.Type == packets.Pubrec || m.FixedHeader.Type == packets.Pubcomp
}

// table returns the map for entries of that direction, made if make is set.
func (i *Inflight) table(inbound, make bool) map[uint16]packets.Packet {
	t := &i.internal
	if inbound {
		t = &i.inbound
	}
	if *t == nil && make {
		*t = map[uint16]packets.Packet{}
	}
	return *t
}

// Set adds or updates an inflight packet by packet id, in the table of its
// direction (IsInbound).
func (i *Inflight) Set(m packets.Packet) bool {
	i.Lock()
	defer i.Unlock()

	t := i.table(IsInbound(m), true)
	_, ok := t[m.PacketID]
	t[m.PacketID] = m
	if !ok {
		i.held.Add(1)
	}
	return !ok
}

// Get returns the server's inflight packet with that packet id.
func (i *Inflight) Get(id uint16) (packets.Packet, bool) {
	return i.get(false, id)
}

// GetInbound returns the entry of the client's publish with that packet id.
func (i *Inflight) GetInbound(id uint16) (packets.Packet, bool) {
	return i.get(true, id)
}

func (i *Inflight) get(inbound bool, id uint16) (packets.Packet, bool) {
	if i.held.Load() == 0 {
		return packets.Packet{}, false // Keyline's fork: empty, no lock (held moves under it)
	}
	i.RLock()
	defer i.RUnlock()

	if m, ok := i.table(inbound, false)[id]; ok {
		return m, true
	}

	return packets.Packet{}, false
}

// Len returns the size of the inflight messages map (both directions).
func (i *Inflight) Len() int {
	i.RLock()
	defer i.RUnlock()
	return len(i.internal) + len(i.inbound)
}

// Clone returns a new instance of Inflight with the same message data.
// This is used when transferring inflights from a taken-over session.
func (i *Inflight) Clone() *Inflight {
	c := NewInflights()
	i.RLock()
	defer i.RUnlock()
	c.internal = maps.Clone(i.internal)
	c.inbound = maps.Clone(i.inbound)
	c.held.Store(int32(len(c.internal) + len(c.inbound)))
	return c
}

// GetAll returns all the inflight messages (both directions).
func (i *Inflight) GetAll(immediate bool) []packets.Packet {
	i.RLock()
	defer i.RUnlock()
	return i.getAll(immediate)
}

// getAll is GetAll under the caller's lock (NextImmediate took the read lock
// twice, which deadlocks with a writer waiting in between).
func (i *Inflight) getAll(immediate bool) []packets.Packet {
	m := []packets.Packet{}
	for _, t := range []map[uint16]packets.Packet{i.internal, i.inbound} {
		for _, v := range t {
			if !immediate || (immediate && v.Expiry < 0) {
				m = append(m, v)
			}
		}
	}

	sort.Slice(m, func(i, j int) bool {
		return uint16(m[i].Created) < uint16(m[j].Created)
	})

	return m
}

// NextImmediate returns the next inflight packet which is indicated to be sent immediately.
// This typically occurs when the quota has been exhausted, and we need to wait until new quota
// is free to continue sending.
func (i *Inflight) NextImmediate() (packets.Packet, bool) {
	i.RLock()
	defer i.RUnlock()

	m := i.getAll(true)
	if len(m) > 0 {
		return m[0], true
	}

	return packets.Packet{}, false
}

// Delete removes the server's in-flight message with that packet id. Returns
// true if the message existed.
func (i *Inflight) Delete(id uint16) bool {
	return i.delete(false, id)
}

// DeleteInbound removes the entry of the client's publish with that packet id.
func (i *Inflight) DeleteInbound(id uint16) bool {
	return i.delete(true, id)
}

// Remove removes the entry m from the table of its direction (IsInbound).
func (i *Inflight) Remove(m packets.Packet) bool {
	return i.delete(IsInbound(m), m.PacketID)
}

func (i *Inflight) delete(inbound bool, id uint16) bool {
	i.Lock()
	defer i.Unlock()

	t := i.table(inbound, false)
	_, ok := t[id]
	delete(t, id)
	if ok {
		i.held.Add(-1)
	}

	return ok
}

// TakeRecieveQuota reduces the receive quota by 1.
func (i *Inflight) DecreaseReceiveQuota() {
	if atomic.LoadInt32(&i.receiveQuota) > 0 {
		atomic.AddInt32(&i.receiveQuota, -1)
	}
}

// TakeRecieveQuota increases the receive quota by 1.
func (i *Inflight) IncreaseReceiveQuota() {
	if atomic.LoadInt32(&i.receiveQuota) < atomic.LoadInt32(&i.maximumReceiveQuota) {
		atomic.AddInt32(&i.receiveQuota, 1)
	}
}

// ResetReceiveQuota resets the receive quota to the maximum allowed value.
func (i *Inflight) ResetReceiveQuota(n int32) {
	atomic.StoreInt32(&i.receiveQuota, n)
	atomic.StoreInt32(&i.maximumReceiveQuota, n)
}

// DecreaseSendQuota reduces the send quota by 1.
func (i *Inflight) DecreaseSendQuota() {
	if atomic.LoadInt32(&i.sendQuota) > 0 {
		atomic.AddInt32(&i.sendQuota, -1)
	}
}

// IncreaseSendQuota increases the send quota by 1.
func (i *Inflight) IncreaseSendQuota() {
	if atomic.LoadInt32(&i.sendQuota) < atomic.LoadInt32(&i.maximumSendQuota) {
		atomic.AddInt32(&i.sendQuota, 1)
	}
}

// ResetSendQuota resets the send quota to the maximum allowed value.
func (i *Inflight) ResetSendQuota(n int32) {
	atomic.StoreInt32(&i.sendQuota, n)
	atomic.StoreInt32(&i.maximumSendQuota, n)
}
