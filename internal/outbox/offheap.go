package outbox

import "sync"

// Frames off the heap. A message's frame is in one place: in memory, in
// the Store only (cold), or in the outbox's spill file only (spilled).
// Cold is where a persistent session's frames go: their records are in the
// Store already, so a frame past the Spill's threshold whose record is
// known committed is let go and read back from the Store when it is to be
// sent (again). The spill file takes only what the Store does not hold:
// the frames of sessions that are not persisted, and of messages whose
// record is not known committed (written behind, not with PutDurable).

// spillMore bounds the frames spillLocked moves per call besides the
// newest: the backlog's memory comes down over a few messages, not at once.
const spillMore = 2

// committedSeqs are the messages whose records a DurableStore reported
// committed, noted by its callbacks (which may run anywhere, even inside
// AddDurable) under a lock of their own and taken under the outbox's.
// offHeap is an outbox's state for frames kept off the heap (a Spill's).
type offHeap struct {
	spill *spillFile // nil until the outbox first spills
	// spillScan: no frame on the wire before it is in memory (where
	// spillLocked looks for the next one).
	spillScan int
	// committed are the records PutDurable reported committed, taken
	// (into committedBuf) by spillLocked.
	committed    committedSeqs
	committedBuf []uint64
}

// offLocked returns the outbox's off-heap state, made on first use.
func (o *Outbox) offLocked() *offHeap {
	if o.mu.off == nil {
		o.mu.off = new(offHeap)
	}
	return o.mu.off
}

type committedSeqs struct {
	sync.Mutex
	seqs []uint64
}

func (c *committedSeqs) note(seq uint64) {
	c.Lock()
	c.seqs = append(c.seqs, seq)
	c.Unlock()
}

func (c *committedSeqs) take(dst []uint64) []uint64 {
	c.Lock()
	dst = append(dst[:0], c.seqs...)
	c.seqs = c.seqs[:0]
	c.Unlock()
	return dst
}

// toStoreLocked reports whether the session's frames go cold (to the
// Store) rather than to the spill file once their records are committed.
func (o *Outbox) toStoreLocked() bool {
	if !o.mu.persist {
		return false
	}
	_, durable := o.cfg.Store.(DurableStore)
	_, loader := o.cfg.Store.(Loader)
	return durable && loader
}

// spillLocked keeps the frames the outbox holds in memory within the
// Spill's threshold. Past it, a persistent session's frames go cold as
// their records are committed (newest first), and the others' newest
// message's frame goes to the spill file if it waits unsent, unless its
// record is being written (pending: it goes cold once committed); then (up
// to spillMore) the oldest frames on the wire, which are kept only to be
// sent again after a reconnect, go cold or to the spill file. A frame stays
// in memory when there is no Spill, no file can be had, or the write fails.
func (o *Outbox) spillLocked(pending bool) {
	sp := o.cfg.Spill
	if sp == nil {
		return
	}
	off := o.offLocked()
	off.committedBuf = off.committed.take(off.committedBuf)
	toStore := o.toStoreLocked()
	for _, seq := range off.committedBuf {
		if e := o.entryLocked(seq); e != nil && e.inMemory() {
			e.stored = true
			if toStore && o.mu.mem > sp.after && (e.state == stSent || int(seq-o.mu.base) >= o.mu.cursor) {
				o.coldLocked(e)
			}
		}
	}
	if o.mu.mem <= sp.after {
		return
	}
	if i := len(o.mu.q) - 1; !pending && i >= o.mu.cursor && o.mu.q[i].inMemory() && o.mu.q[i].state == stQueued {
		if !o.offHeapLocked(&o.mu.q[i]) {
			return
		}
	}
	for n := 0; n < spillMore && o.mu.mem > sp.after; n++ {
		for off.spillScan = max(off.spillScan, o.mu.head); off.spillScan < o.mu.cursor; off.spillScan++ {
			if e := &o.mu.q[off.spillScan]; e.inMemory() && e.state == stSent {
				break
			}
		}
		if off.spillScan >= o.mu.cursor {
			return
		}
		if e := &o.mu.q[off.spillScan]; (toStore && !e.stored) || !o.offHeapLocked(e) {
			return // not committed yet (it goes cold then), or no room in a file
		}
	}
}

// offHeapLocked takes e's frame out of memory: cold when the Store holds
// its record, else to the spill file. It reports false when it could not
// (e stays in memory).
func (o *Outbox) offHeapLocked(e *entry) bool {
	if e.stored && o.toStoreLocked() {
		o.coldLocked(e)
		return true
	}
	return o.spillEntryLocked(e)
}

// coldLocked lets e's frame go: its committed record holds it.
func (o *Outbox) coldLocked(e *entry) {
	e.qos = e.pub.QoS
	e.pub = cold
	o.mu.mem -= int64(e.size)
	o.mu.cold++
	o.cfg.Stats.ColdBytes.Add(int64(e.size))
	o.cfg.Spill.Cooled.Add(1)
}

// spillEntryLocked moves e's frame to the spill file; it reports false when
// it could not (e stays in memory).
func (o *Outbox) spillEntryLocked(e *entry) bool {
	sp, oh := o.cfg.Spill, o.offLocked()
	if oh.spill == nil {
		if oh.spill = sp.open(); oh.spill == nil {
			return false
		}
	}
	off, n, err := oh.spill.put(e.pub)
	if err != nil {
		return false
	}
	e.qos = e.pub.QoS
	e.pub, e.spillOff, e.spillLen = spilled, off, n
	o.mu.mem -= int64(e.size)
	return true
}

// loadLocked brings the frame of e (seq) back into memory from the spill
// file or the Store; it reports false when it could not (the message is
// lost: the caller finishes it; counted in Stats.LoadErrors).
func (o *Outbox) loadLocked(e *entry, seq uint64) bool {
	switch {
	case e.isSpilled():
		p, err := o.mu.off.spill.read(e.spillOff, e.spillLen)
		o.mu.off.spill.release(e.spillOff, e.spillLen)
		e.spillLen = 0 // released
		if err != nil {
			o.cfg.Stats.LoadErrors.Add(1)
			return false
		}
		o.cfg.Spill.Loaded.Add(1)
		e.pub = p
	case e.isCold():
		loaded, ok := o.readColdLocked(seq)
		if !ok {
			o.cfg.Stats.LoadErrors.Add(1)
			return false
		}
		o.mu.cold--
		o.cfg.Stats.ColdBytes.Add(-int64(e.size))
		n := int32(len(loaded.pub.B))
		o.mu.bytes += int64(n - e.size)
		o.cfg.Stats.Bytes.Add(int64(n - e.size))
		e.pub, e.size, e.stored = loaded.pub, n, true
	default:
		return true
	}
	o.mu.mem += int64(e.size)
	return true
}

// readColdLocked reads the stored record of seq.
func (o *Outbox) readColdLocked(seq uint64) (entry, bool) {
	val, err := o.cfg.Store.(Loader).Record(o.client, seq)
	if err != nil || val == nil {
		return entry{}, false
	}
	loaded, err := decodeRecord(val)
	return loaded, err == nil
}

// frameLocked returns e's frame wherever it is, without moving it, or nil
// when it cannot be read.
func (o *Outbox) frameLocked(e *entry, seq uint64) *entry {
	rec := *e
	switch {
	case e.isSpilled():
		p, err := o.mu.off.spill.read(e.spillOff, e.spillLen)
		if err != nil {
			return nil
		}
		rec.pub = p
	case e.isCold():
		loaded, ok := o.readColdLocked(seq)
		if !ok {
			return nil
		}
		rec.pub = loaded.pub
	}
	return &rec
}
