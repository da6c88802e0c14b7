package cluster

import (
	"encoding/binary"
	"errors"

	"github.com/keyline-mq/keyline/internal/wire"
	"github.com/keyline-mq/keyline/keyshared"
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
//
// The format is not versioned; what a newer node adds stays readable to an
// older one where it can (an older holder cannot read upJoinLimit, which is
// sent only for a member with a Maximum Packet Size).

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
	// upJoinLimit is upJoin with the member's packet limit after it, as
	// a join of a member with a Maximum Packet Size travels (decoded as
	// upJoin); a join without one keeps the older upJoin form.
	upJoinLimit
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
	// deliveryUnreadable: the member may not read the message's topic; it
	// was not written to the client (ks_readaccess.go).
	deliveryUnreadable
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
	limit   keyshared.PacketLimit // join: the member's Maximum Packet Size
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
	msg     []byte // encoded message (keyshared.EncodeMessage), deliver and qos0
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
		limited := it.kind == upJoin && it.limit.Max > 0
		if limited {
			out = append(out, upJoinLimit)
		} else {
			out = append(out, it.kind)
		}
		out = appendStr(out, it.member)
		switch it.kind {
		case upJoin:
			out = append(out, it.qos)
			out = binary.AppendUvarint(out, uint64(it.recvMax))
			out = binary.AppendUvarint(out, uint64(len(it.filters)))
			for _, f := range it.filters {
				out = appendStr(out, f)
			}
			if limited {
				out = binary.AppendUvarint(out, uint64(it.limit.Max))
				out = append(out, it.limit.Version)
				out = binary.AppendUvarint(out, uint64(max(it.limit.SubscriptionID, 0)))
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
	d := wire.NewDecoder(buf, errWire)
	var b upBatch
	b.epoch = d.Uvarint()
	b.node = d.String()
	b.seq = d.Uvarint()
	n := d.Count()
	for range n {
		it := upItem{kind: d.Byte()}
		it.member = d.String()
		switch it.kind {
		case upJoin, upJoinLimit:
			it.qos = d.Byte()
			it.recvMax = uint32(min(d.Uvarint(), 1<<32-1))
			for range d.Count() {
				it.filters = append(it.filters, d.String())
			}
			if it.kind == upJoinLimit {
				it.kind = upJoin
				it.limit.Max = uint32(min(d.Uvarint(), 1<<32-1))
				it.limit.Version = d.Byte()
				it.limit.SubscriptionID = int(min(d.Uvarint(), 1<<28)) // MQTT's are below 2^28
			}
		case upActive:
			it.active = d.Byte() == 1
		case upAck, upAcked:
			it.offset = d.Uvarint()
		case upNack, upReject:
			it.offset = d.Uvarint()
			it.reason = d.Byte()
		case upOutstanding:
			it.offset = d.Uvarint()
			it.key = d.String()
		case upLeave, upResync:
		default:
			d.Fail("up item kind")
		}
		if d.Err() != nil {
			break
		}
		b.items = append(b.items, it)
	}
	return b, d.Done()
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
	d := wire.NewDecoder(buf, errWire)
	var b downBatch
	b.group = d.String()
	b.node = d.String()
	b.epoch = d.Uvarint()
	b.seq = d.Uvarint()
	for range d.Count() {
		it := downItem{kind: d.Byte()}
		it.member = d.String()
		it.offset = d.Uvarint()
		switch it.kind {
		case downDeliver, downQoS0:
			it.attempt = uint32(min(d.Uvarint(), 1<<32-1))
			it.msg = d.Bytes()
		case downRevoke:
		default:
			d.Fail("down item kind")
		}
		if d.Err() != nil {
			break
		}
		b.items = append(b.items, it)
	}
	return b, d.Done()
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
