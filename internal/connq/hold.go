package connq

import "errors"

// Hold keeps one acknowledgement frame (a PUBACK or PUBREC that mochi is
// about to write) from leaving until a durable write it depends on has
// finished, without blocking mochi: frames queued after it wait behind it, so
// the connection's order is kept. Release lets it go; Fail turns it into a
// failure acknowledgement (MQTT 5) or cuts the connection (MQTT 3.1.1).
// Several writes may hold one frame (a publish that Key-Shared groups and
// persistent sessions both store): each HoldAck adds a part, and the frame
// goes once every part released it, or as a failure as soon as one failed.
type Hold struct {
	c        *Conn
	typ      byte   // MQTT packet type of the frame: 4 PUBACK, 5 PUBREC
	id       uint16 // its packet id
	v5       bool
	replace  []byte // the failure acknowledgement sent instead, once Fail decided it
	attached bool
	decided  bool
	failed   bool
	code     byte
	parts    int // HoldAcks of the frame that have not decided yet
}

// HoldAck holds the next acknowledgement of type typ (4 PUBACK, 5 PUBREC)
// for packet id that is written to c. v5 says whether a failure can be told
// with a reason code. While mochi has not written the frame, another HoldAck
// of it joins the first and returns the same Hold: call Release or Fail once
// per HoldAck.
func (c *Conn) HoldAck(typ byte, id uint16, v5 bool) *Hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.mu.holds {
		if h.typ == typ && h.id == id && !h.attached {
			h.parts++
			if h.decided && !h.failed {
				h.decided = false // released by the others: this part decides too
			}
			return h
		}
	}
	h := &Hold{c: c, typ: typ, id: id, v5: v5, parts: 1}
	c.mu.holds = append(c.mu.holds, h)
	return h
}

// attachLocked gives e to the pending hold it acknowledges, if any.
func (c *Conn) attachLocked(e *entry) {
	b := e.b
	if len(b) < 4 {
		return
	}
	typ, id := b[0]>>4, uint16(b[2])<<8|uint16(b[3])
	for i, h := range c.mu.holds {
		if h.typ != typ || h.id != id {
			continue
		}
		c.mu.holds = append(c.mu.holds[:i], c.mu.holds[i+1:]...)
		h.attached = true
		if !h.decided {
			e.hold = h
			return
		}
		if h.failed {
			c.failFrameLocked(h)
			if h.replace != nil {
				e.b = h.replace
			}
		}
		return
	}
}

// Release lets the held frame go as mochi wrote it.
func (h *Hold) Release() { h.decide(false, 0, true) }

// Fail answers the held acknowledgement with reason code instead (MQTT 5),
// or cuts the connection (MQTT 3.1.1, which cannot refuse a publish).
func (h *Hold) Fail(code byte) { h.decide(true, code, true) }

// decideLocked records a part's decision (it takes the connection's lock).
// It reports whether the frame is queued and decided now, so that its
// writer must run: started here when schedule is set, else by the caller
// (a Flusher).
func (h *Hold) decide(failed bool, code byte, schedule bool) bool {
	c := h.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.decided {
		return false
	}
	if h.parts--; h.parts > 0 && !failed {
		return false // the other parts decide
	}
	h.decided, h.failed, h.code = true, failed, code
	if !h.attached {
		if failed && !h.v5 {
			c.failLocked(errors.New("connq: message not stored; MQTT 3.1.1 cannot refuse it"))
		}
		return false // mochi has not written the frame yet: Write applies the decision
	}
	if failed {
		c.failFrameLocked(h)
	}
	if schedule {
		c.scheduleLocked()
	}
	return true
}

// failFrameLocked prepares the failure acknowledgement that replaces a held
// frame (MQTT 5), or cuts the connection (MQTT 3.1.1).
func (c *Conn) failFrameLocked(h *Hold) {
	if !h.v5 {
		c.failLocked(errors.New("connq: message not stored; MQTT 3.1.1 cannot refuse it"))
		return
	}
	h.replace = []byte{h.typ << 4, 3, byte(h.id >> 8), byte(h.id), h.code}
}

// heldLocked reports whether the next frame waits for a hold's decision.
func (c *Conn) heldLocked() bool {
	if c.mu.head == len(c.mu.q) {
		return false
	}
	h := c.mu.q[c.mu.head].hold
	return h != nil && !h.decided
}

// abandonHolds ends a closed connection's wait for held acknowledgements
// (HoldCloseTimeout after the writer found one blocking it): the first
// undecided one and every frame behind it are not sent, but for a closing
// DISCONNECT, which the writer then sends and finishes the connection. Nothing
// acknowledged is lost: a publisher that gets no acknowledgement resends
// (QoS 1 and 2 are at least once), and the deliveries behind it stay in the
// session they came from, as they do when a connection is cut.
func (c *Conn) abandonHolds() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.finished || c.mu.failed != nil || !c.heldLocked() {
		return
	}
	var keep []entry
	bytes, held := 0, uint64(0)
	for _, e := range c.mu.q[c.mu.head:] {
		if e.hold != nil && !e.hold.decided {
			held++
		}
		if e.kind == kindMochi && len(e.b) > 0 && e.b[0]>>4 == 14 { // DISCONNECT
			e.hold = nil
			keep = append(keep, e)
			bytes += len(e.b)
		}
	}
	c.mu.shift += uint64(len(c.mu.q))
	c.mu.q, c.mu.head, c.mu.bytes = keep, 0, bytes
	clear(c.mu.conflate) // positions moved; the index starts over
	c.stats.AbandonedHolds.Add(held)
	c.log.Debug("closing connection: acknowledgements still held on durable writes are not sent; the publisher resends",
		"remote", c.RemoteAddr().String(), "held", held, "timeout", HoldCloseTimeout)
	c.scheduleLocked()
}
