package connq

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyline-mq/keyline/internal/frame"
)

// copyWhole is the largest publish the writer copies whole into its scratch
// buffer when it edits one; a larger one is sent as an edited head followed
// by its shared tail, without copying the payload.
const copyWhole = 512

// batch is the writer's working set for one wakeup. Batches are pooled, so
// that a connection keeps no buffers between wakeups.
type batch struct {
	entries []entry
	signal  uint64 // messages missed, to report in this batch's first publish
	session Session
	scratch []byte // edited publishes (or, off TCP, everything)
	segs    []seg
	bufs    net.Buffers
	user    []byte
	strip   []frame.Span // reused by each publish's StripUser
}

// seg is scratch[off:end] followed by ext (which may be nil).
type seg struct {
	off, end int
	ext      []byte
}

var batchPool = sync.Pool{New: func() any { return new(batch) }}

func (bt *batch) release() {
	clear(bt.entries) // drop references to shared frames
	clear(bt.segs)
	clear(bt.bufs)
	bt.entries, bt.segs, bt.bufs, bt.scratch = bt.entries[:0], bt.segs[:0], bt.bufs[:0], bt.scratch[:0]
	bt.signal = 0
	if cap(bt.scratch) > 4*BatchBudget {
		bt.scratch = nil // do not pin a one-off huge buffer
	}
	batchPool.Put(bt)
}

type takeResult uint8

const (
	takeBatch takeResult = iota // write the batch
	takeIdle                    // nothing to write now: the writer exits until scheduled again
	takeDone                    // closed or failed: finish the connection
)

// take moves up to BatchBudget bytes of frames into bt. It returns the
// function to call, with no lock held, because tracked publishes fit again.
func (c *Conn) take(bt *batch) (takeResult, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gated := !c.mu.connacked
	switch {
	case c.mu.failed != nil || (c.mu.closing && (c.mu.head == len(c.mu.q) || gated)):
		c.mu.q, c.mu.head, c.mu.bytes, c.mu.conflate, c.mu.wake = nil, 0, 0, nil, nil
		return takeDone, nil
	case c.mu.head == len(c.mu.q) || c.heldLocked() || gated:
		if c.mu.closing && c.mu.holdTimer == nil && c.heldLocked() {
			// Closed, and a held acknowledgement blocks the queue: its
			// durable write may take as long as its timeout (a JetStream
			// publish retried for seconds), which no write deadline bounds.
			c.mu.holdTimer = time.AfterFunc(HoldCloseTimeout, c.abandonHolds)
		}
		c.mu.scheduled = false // Enqueue, Write (the CONNACK), Close or a hold's decision start it again
		return takeIdle, nil
	}
	n := 0
	publishes := false
	for c.mu.head < len(c.mu.q) {
		e := c.mu.q[c.mu.head]
		if e.b != nil && n > 0 && n+len(e.b) > BatchBudget {
			break
		}
		if e.hold != nil && !e.hold.decided {
			break // it and everything after it wait for the decision
		}
		if e.kind == kindShared && e.b != nil {
			c.forgetTopicLocked(c.mu.head)
		}
		c.mu.q[c.mu.head] = entry{}
		c.mu.head++
		if e.b != nil {
			n += len(e.b) // queued bytes were counted with the frame as queued
			if e.hold != nil && e.hold.replace != nil {
				e.b = e.hold.replace
			}
			publishes = publishes || e.pub != nil
			bt.entries = append(bt.entries, e)
		}
	}
	c.mu.bytes -= n
	if c.mu.head == len(c.mu.q) {
		c.mu.shift += uint64(c.mu.head)
		c.mu.q, c.mu.head = c.mu.q[:0], 0
		if cap(c.mu.q) > 4096 || cap(c.mu.q) <= 4 {
			// A burst is over: do not keep its backing array; nor a small one,
			// which is what an idle connection had (CONNACK, SUBACK, PINGRESP).
			c.mu.q = nil
		}
	} else if c.mu.head > 1024 && c.mu.head*2 > len(c.mu.q) {
		c.mu.shift += uint64(c.mu.head)
		c.mu.q = append(c.mu.q[:0], c.mu.q[c.mu.head:]...)
		c.mu.head = 0
	}
	if c.mu.bytes <= c.mu.limits.Soft {
		c.mu.overSoft = 0
	}
	bt.session = c.mu.session
	if publishes && c.mu.missed > 0 && bt.session.DropSignal && bt.session.Version == 5 {
		bt.signal, c.mu.missed = c.mu.missed, 0
	}
	var wake func()
	if c.mu.wake != nil && c.mu.bytes < c.mu.limits.roomLimit() {
		wake, c.mu.wake = c.mu.wake, nil
	}
	return takeBatch, wake
}

// run is the writer: it drains the queue, one writev per batch, and exits
// when the queue is empty (or finishes the connection once it is closed).
func (c *Conn) run() { c.runFrom(nil, nil) }

// runFrom is run, first sending rest, what a direct write (flush.go) left of
// batch bt.
func (c *Conn) runFrom(bt *batch, rest net.Buffers) {
	if bt != nil {
		_, err := rest.WriteTo(c.tcpConn())
		c.finishBatch(bt, err)
	}
	for {
		bt := batchPool.Get().(*batch)
		res, wake := c.take(bt)
		switch res {
		case takeIdle:
			bt.release()
			return // touch nothing after this: another writer may start at once
		case takeDone:
			bt.release()
			_ = c.Conn.Close()
			c.finish()
			return
		}
		if wake != nil {
			wake() // the outbox queues more while this batch is written
		}
		c.finishBatch(bt, c.write(bt))
	}
}

// finishBatch counts a written batch and lets it go; a write error cuts the
// connection (the next take finishes it).
func (c *Conn) finishBatch(bt *batch, err error) {
	c.account(bt)
	bt.release()
	if err != nil {
		c.mu.Lock()
		c.failLocked(err)
		c.mu.Unlock()
	}
}

// write edits the batch's publishes and sends the batch: one writev on TCP,
// one coalesced Write otherwise.
func (c *Conn) write(bt *batch) error {
	tcp := c.tcpConn()
	if tcp == nil {
		c.build(bt)
		_, err := c.Conn.Write(bt.scratch)
		return err
	}
	bufs := c.build(bt) // WriteTo consumes its receiver: bt.bufs stays whole for release
	_, err := bufs.WriteTo(tcp)
	return err
}

// build edits the batch's publishes and lays the batch out: as buffers for a
// writev on TCP (returned), coalesced into bt.scratch otherwise.
func (c *Conn) build(bt *batch) net.Buffers {
	coalesce := c.tcpConn() == nil
	now := int64(0)
	signalled := false
	for i := range bt.entries {
		e := &bt.entries[i]
		p := e.pub
		if p == nil {
			bt.add(e.b, coalesce)
			continue
		}
		ed := frame.Edit{ID: e.id, Dup: e.dup}
		if p.HasExpiry() {
			if now == 0 {
				now = time.Now().Unix()
			}
			ed.Now = now
		}
		newAlias := c.alias(bt, p, &ed)
		if bt.session.DropSignal && p.Version == 5 {
			// The publisher's own "dropped" would read as the broker's
			// signal: a client that asked for the signal never sees one.
			ed.Strip = bt.strip
			p.StripUser(&ed, DropSignalProperty)
			bt.strip = ed.Strip[:0]
		}
		if bt.signal > 0 && !signalled {
			bt.user = frame.AppendUserProperty(bt.user[:0], DropSignalProperty, strconv.FormatUint(bt.signal, 10))
			ed.User = bt.user
		}
		if max := bt.session.MaxPacketSize; max > 0 && uint32(p.Size(&ed)) > max {
			ed.User = nil // the signal waits for a frame it fits in
			if uint32(p.Size(&ed)) > max && newAlias {
				delete(c.aliases, p.Topic) // the topic and its alias do not fit: no alias
				c.aliasBytes -= len(p.Topic)
				ed.Alias, ed.AliasOnly = 0, false
			}
		}
		if ed.User != nil {
			signalled = true
			c.stats.DropSignals.Add(1)
		}
		if e.kind == kindShared && ed.Alias == 0 && ed.User == nil && ed.Now == 0 && len(ed.Strip) == 0 {
			bt.add(p.B, coalesce) // unedited: the shared bytes themselves
			continue
		}
		off := len(bt.scratch)
		var tail []byte
		bt.scratch, tail = p.AppendEdited(bt.scratch, &ed, coalesce || len(p.B) <= copyWhole)
		bt.segs = append(bt.segs, seg{off: off, end: len(bt.scratch), ext: tail})
	}
	if bt.signal > 0 && !signalled {
		c.mu.Lock()
		c.mu.missed += bt.signal // no frame could carry it: the next batch tries
		c.mu.Unlock()
	}
	if coalesce {
		return nil
	}
	// Segments reference the scratch buffer by offset: it may have grown
	// (and moved) while they were appended. Adjacent edited frames make one piece.
	piece := -1 // start of the scratch piece the last buffer holds, if it does
	for _, s := range bt.segs {
		if s.end > s.off {
			if piece >= 0 {
				bt.bufs[len(bt.bufs)-1] = bt.scratch[piece:s.end]
			} else {
				piece = s.off
				bt.bufs = append(bt.bufs, bt.scratch[s.off:s.end])
			}
		}
		if len(s.ext) > 0 {
			bt.bufs = append(bt.bufs, s.ext)
			piece = -1
		}
	}
	return bt.bufs
}

// add appends an unedited frame: by reference, or copied when coalescing.
func (bt *batch) add(b []byte, coalesce bool) {
	if coalesce {
		bt.scratch = append(bt.scratch, b...)
		return
	}
	bt.segs = append(bt.segs, seg{off: len(bt.scratch), end: len(bt.scratch), ext: b})
}

// alias sets ed's topic alias for p when the client allows aliases, and
// reports whether it assigned a new one. Aliases are assigned in the order
// frames are written, so the first frame using one announces it; once the
// table holds TopicAliasBytes of topics, later topics go without (aliases
// cannot be taken back from a client, so the table never shrinks: 1,000
// topics of 30 KB held 31 MB per subscriber before the bound).
func (c *Conn) alias(bt *batch, p *frame.Publish, ed *frame.Edit) bool {
	max := bt.session.TopicAliasMax
	if max == 0 || bt.session.Version != 5 || p.Topic == "" {
		return false
	}
	if a, ok := c.aliases[p.Topic]; ok {
		ed.Alias, ed.AliasOnly = a, true
		return false
	}
	if len(c.aliases) >= int(max) {
		return false
	}
	if limit := bt.session.TopicAliasBytes; limit > 0 && c.aliasBytes+len(p.Topic) > limit {
		return false
	}
	if c.aliases == nil {
		c.aliases = map[string]uint16{}
	}
	a := uint16(len(c.aliases) + 1)
	c.aliases[strings.Clone(p.Topic)] = a // the table outlives the frame
	c.aliasBytes += len(p.Topic)
	ed.Alias = a
	return true
}

func (c *Conn) account(bt *batch) {
	c.stats.Writes.Add(1)
	c.stats.Frames.Add(uint64(len(bt.entries)))
	var msgs, bytes int64
	for _, e := range bt.entries {
		if e.pub != nil || e.kind == kindSent {
			msgs++
			bytes += int64(len(e.b))
		}
	}
	if msgs > 0 {
		addInfo(c.stats.InfoMessagesSent, msgs)
		addInfo(c.stats.InfoPacketsSent, msgs)
		addInfo(c.stats.InfoBytesSent, bytes)
	}
}
