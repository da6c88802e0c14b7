package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The wire format of Key-Shared traffic between nodes. Two kinds of batch
// travel as NATS requests, each answered once it is applied:
//
//   - an up batch, from a node to the holder of a group's lease (kl.k.<group
//     hash>): what the node's members did (join, leave, (dis)connect, ack,
//     nack, reject) and, after a change of holder, a resync (the node's
//     members and the deliveries they hold);
//   - a down batch, from the holder to a node (kl.d.<node hash>): deliveries
//     to the node's members and revocations of them.
//
// Batches are numbered per sender and epoch; a receiver applies each number
// once and answers a retry from what it remembers, so a batch lost with a
// NATS server is sent again without being applied twice.

// Up items.
const (
	upJoin        byte = iota + 1 // member joined or changed options
	upLeave                       // member left the group
	upActive                      // member (dis)connected
	upAck                         // PUBACK / PUBCOMP
	upNack                        // reason >= 0x80: retry
	upReject                      // never retry: dead-letter
	upResync                      // the node's members follow; any member not listed left
	upOutstanding                 // a delivery the member holds (after a resync)
	upAcked                       // an ack made under an earlier holder (after a resync)
)

// resyncEnd is the member of the upResync item that closes a resync's
// member list (MQTT client ids never hold U+0000).
const resyncEnd = "\x00end"

// Down items.
const (
	downDeliver byte = iota + 1
	downRevoke
	downQoS0
)

// Answers.
const (
	replyOK         byte = 0
	replyWrongEpoch byte = 1 // the receiver knows another epoch: the uvarint that follows
)

// Outcomes of a delivery in a down batch's answer.
const (
	deliveredOK byte = iota
	deliveryRefused
)

var errWire = errors.New("cluster: malformed key-shared message")

type upItem struct {
	kind    byte
	member  string
	offset  uint64
	reason  byte
	active  bool
	qos     byte
	recvMax uint32
	filters []string
	key     string
}

type upBatch struct {
	epoch uint64
	node  string
	seq   uint64
	items []upItem
}

type downItem struct {
	kind    byte
	member  string
	offset  uint64
	attempt uint32
	msg     []byte // encoded message (persistence.EncodeMessage), deliver and qos0
}

type downBatch struct {
	group string // group hash
	node  string // the holder
	epoch uint64
	seq   uint64
	items []downItem
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func (b *upBatch) encode() []byte {
	out := make([]byte, 0, 64+32*len(b.items))
	out = binary.AppendUvarint(out, b.epoch)
	out = appendStr(out, b.node)
	out = binary.AppendUvarint(out, b.seq)
	out = binary.AppendUvarint(out, uint64(len(b.items)))
	for i := range b.items {
		it := &b.items[i]
		out = append(out, it.kind)
		out = appendStr(out, it.member)
		switch it.kind {
		case upJoin:
			out = append(out, it.qos)
			out = binary.AppendUvarint(out, uint64(it.recvMax))
			out = binary.AppendUvarint(out, uint64(len(it.filters)))
			for _, f := range it.filters {
				out = appendStr(out, f)
			}
		case upActive:
			out = append(out, boolByte(it.active))
		case upAck, upAcked:
			out = binary.AppendUvarint(out, it.offset)
		case upNack, upReject:
			out = binary.AppendUvarint(out, it.offset)
			out = append(out, it.reason)
		case upOutstanding:
			out = binary.AppendUvarint(out, it.offset)
			out = appendStr(out, it.key)
		}
	}
	return out
}

func decodeUpBatch(buf []byte) (upBatch, error) {
	d := wdec{b: buf}
	var b upBatch
	b.epoch = d.uvarint()
	b.node = d.str()
	b.seq = d.uvarint()
	n := d.count()
	for range n {
		it := upItem{kind: d.byte()}
		it.member = d.str()
		switch it.kind {
		case upJoin:
			it.qos = d.byte()
			it.recvMax = uint32(min(d.uvarint(), 1<<32-1))
			for range d.count() {
				it.filters = append(it.filters, d.str())
			}
		case upActive:
			it.active = d.byte() == 1
		case upAck, upAcked:
			it.offset = d.uvarint()
		case upNack, upReject:
			it.offset = d.uvarint()
			it.reason = d.byte()
		case upOutstanding:
			it.offset = d.uvarint()
			it.key = d.str()
		case upLeave, upResync:
		default:
			d.fail("up item kind")
		}
		if d.err != nil {
			break
		}
		b.items = append(b.items, it)
	}
	return b, d.done()
}

func (b *downBatch) encode() []byte {
	size := 64
	for i := range b.items {
		size += 24 + len(b.items[i].member) + len(b.items[i].msg)
	}
	out := make([]byte, 0, size)
	out = appendStr(out, b.group)
	out = appendStr(out, b.node)
	out = binary.AppendUvarint(out, b.epoch)
	out = binary.AppendUvarint(out, b.seq)
	out = binary.AppendUvarint(out, uint64(len(b.items)))
	for i := range b.items {
		it := &b.items[i]
		out = append(out, it.kind)
		out = appendStr(out, it.member)
		out = binary.AppendUvarint(out, it.offset)
		if it.kind == downDeliver || it.kind == downQoS0 {
			out = binary.AppendUvarint(out, uint64(it.attempt))
			out = binary.AppendUvarint(out, uint64(len(it.msg)))
			out = append(out, it.msg...)
		}
	}
	return out
}

func decodeDownBatch(buf []byte) (downBatch, error) {
	d := wdec{b: buf}
	var b downBatch
	b.group = d.str()
	b.node = d.str()
	b.epoch = d.uvarint()
	b.seq = d.uvarint()
	for range d.count() {
		it := downItem{kind: d.byte()}
		it.member = d.str()
		it.offset = d.uvarint()
		switch it.kind {
		case downDeliver, downQoS0:
			it.attempt = uint32(min(d.uvarint(), 1<<32-1))
			it.msg = d.bytes()
		case downRevoke:
		default:
			d.fail("down item kind")
		}
		if d.err != nil {
			break
		}
		b.items = append(b.items, it)
	}
	return b, d.done()
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// wdec decodes the wire format; the first error sticks (and empties it).
type wdec struct {
	b   []byte
	err error
}

func (d *wdec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errWire, what)
	}
	d.b = nil
}

// take returns the next n bytes (capped: an append copies), or fails.
func (d *wdec) take(n uint64, what string) []byte {
	if d.err != nil || n > uint64(len(d.b)) {
		d.fail(what)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *wdec) byte() byte {
	if v := d.take(1, "short"); v != nil {
		return v[0]
	}
	return 0
}

func (d *wdec) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("varint")
	}
	d.take(uint64(max(n, 0)), "varint")
	return v
}

// varint reads binary.AppendVarint's zig-zag encoding.
func (d *wdec) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// count reads a count of items, each of which takes at least one byte.
func (d *wdec) count() int {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("count")
		return 0
	}
	return int(n)
}

func (d *wdec) bytes() []byte { return d.take(d.uvarint(), "length") }

func (d *wdec) str() string { return string(d.bytes()) }

func (d *wdec) done() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("trailing bytes")
	}
	return d.err
}
