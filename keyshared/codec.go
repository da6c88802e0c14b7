package keyshared

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/keyline-mq/keyline/internal/wire"
)

// The one encoding of a group log message and of a dead letter, whichever
// backend keeps them: the segment log and bbolt on one node, JetStream in a
// cluster (and the holder's deliveries to other nodes).

// ErrBadRecord is wrapped by every error decoding a message or a dead letter.
var ErrBadRecord = errors.New("malformed record")

const (
	msgVersion = 1
	dlVersion  = 1
)

// Message flags.
const (
	flagKeyIsTopic    = 1 << 0 // the key equals the topic and is not stored
	flagPayloadFormat = 1 << 1 // a payload format byte follows the QoS
	flagProps         = 1 << 2 // content type, response topic, correlation data and user properties follow the key
)

// A message is encoded as:
//
//	version    byte (1)
//	flags      byte (flag... above)
//	qos        byte
//	format     byte                      if flagPayloadFormat
//	published  varint unix nanoseconds   (0 = zero time)
//	expires    varint unix nanoseconds   (0 = never)
//	topic      uvarint length, bytes
//	key        uvarint length, bytes     unless flagKeyIsTopic
//	props      if flagProps: content type, response topic, correlation data
//	           (each uvarint length, bytes), uvarint count of user properties,
//	           then key and value of each (uvarint length, bytes)
//	payload    the rest of the value
//
// Its Offset is not part of it. A message encodes to MessageSize(m) bytes;
// that size is what the backlog's byte limits count.

func hasProps(p *Properties) bool {
	return p.ContentType != "" || p.ResponseTopic != "" || len(p.CorrelationData) > 0 || len(p.User) > 0
}

// MessageSize returns the encoded size of m.
func MessageSize(m *Message) int {
	n := 3 + wire.VarintLen(wire.TimeNanos(m.PublishedAt)) + wire.VarintLen(wire.TimeNanos(m.ExpiresAt)) + wire.StringLen(len(m.Topic))
	if m.Props.PayloadFormatSet {
		n++
	}
	if m.Key != m.Topic {
		n += wire.StringLen(len(m.Key))
	}
	if p := &m.Props; hasProps(p) {
		n += wire.StringLen(len(p.ContentType)) + wire.StringLen(len(p.ResponseTopic)) + wire.StringLen(len(p.CorrelationData))
		n += wire.UvarintLen(uint64(len(p.User)))
		for _, u := range p.User {
			n += wire.StringLen(len(u.Key)) + wire.StringLen(len(u.Val))
		}
	}
	return n + len(m.Payload)
}

// AppendMessage appends the encoding of m to dst.
func AppendMessage(dst []byte, m *Message) []byte {
	var flags byte
	if m.Key == m.Topic {
		flags |= flagKeyIsTopic
	}
	if m.Props.PayloadFormatSet {
		flags |= flagPayloadFormat
	}
	p := &m.Props
	if hasProps(p) {
		flags |= flagProps
	}
	dst = append(dst, msgVersion, flags, m.QoS)
	if m.Props.PayloadFormatSet {
		dst = append(dst, m.Props.PayloadFormat)
	}
	dst = binary.AppendVarint(dst, wire.TimeNanos(m.PublishedAt))
	dst = binary.AppendVarint(dst, wire.TimeNanos(m.ExpiresAt))
	dst = wire.AppendString(dst, m.Topic)
	if flags&flagKeyIsTopic == 0 {
		dst = wire.AppendString(dst, m.Key)
	}
	if flags&flagProps != 0 {
		dst = wire.AppendString(dst, p.ContentType)
		dst = wire.AppendString(dst, p.ResponseTopic)
		dst = wire.AppendBytes(dst, p.CorrelationData)
		dst = binary.AppendUvarint(dst, uint64(len(p.User)))
		for _, u := range p.User {
			dst = wire.AppendString(dst, u.Key)
			dst = wire.AppendString(dst, u.Val)
		}
	}
	return append(dst, m.Payload...)
}

// EncodeMessage returns the encoding of m in a new slice of exactly its size.
func EncodeMessage(m *Message) []byte {
	return AppendMessage(make([]byte, 0, MessageSize(m)), m)
}

// DecodeMessage decodes what EncodeMessage returned. With own set, buf
// belongs to the caller for good: the payload, correlation data and some
// strings of the result point into it, so it must never be written again.
// Otherwise (buf is memory valid only for a while: a bbolt transaction, a
// NATS message being handled) buf is first copied once, and the message
// points into the copy. Topic and key are always copies: a Key-Shared window
// keeps a key (and its map entry) for a while after its last message
// resolved, and a view would keep the whole record, payload included, alive
// with it. One allocation holds both.
func DecodeMessage(buf []byte, own bool) (Message, error) {
	if !own {
		buf = append([]byte(nil), buf...)
	}
	d := wire.NewDecoder(buf, ErrBadRecord)
	var m Message
	if v := d.Byte(); v != msgVersion {
		if d.Err() != nil {
			return m, d.Err()
		}
		return m, fmt.Errorf("%w: message version %d", ErrBadRecord, v)
	}
	flags := d.Byte()
	m.QoS = d.Byte()
	if flags&flagPayloadFormat != 0 {
		m.Props.PayloadFormat = d.Byte()
		m.Props.PayloadFormatSet = true
	}
	m.PublishedAt = wire.TimeFromNanos(d.Varint())
	m.ExpiresAt = wire.TimeFromNanos(d.Varint())
	topic := d.Bytes()
	if flags&flagKeyIsTopic != 0 {
		m.Topic = string(topic)
		m.Key = m.Topic
	} else {
		key := d.Bytes()
		both := string(topic) + string(key)
		m.Topic, m.Key = both[:len(topic)], both[len(topic):]
	}
	if flags&flagProps != 0 {
		// Views: these live only as long as the message and its payload.
		m.Props.ContentType = d.StringView()
		m.Props.ResponseTopic = d.StringView()
		m.Props.CorrelationData = d.Bytes()
		if n := d.Count(); n > 0 { // every property takes at least two bytes
			m.Props.User = make([]UserProperty, n)
			for i := range m.Props.User {
				m.Props.User[i] = UserProperty{Key: d.StringView(), Val: d.StringView()}
			}
		}
	}
	if d.Err() != nil {
		return Message{}, d.Err()
	}
	if rest := d.Rest(); len(rest) > 0 {
		m.Payload = rest[:len(rest):len(rest)] // capped: an append by the reader copies
	}
	return m, nil
}

// A dead letter is encoded as:
//
//	version      byte (1)
//	offset       uvarint  (the message's offset in the log when it died)
//	attempts     uvarint
//	reason       byte
//	first, last, dead  varint unix nanoseconds each (0 = zero time)
//	message      a message, as above, to the end
//
// Its group is not part of it.

// AppendDeadLetter appends the encoding of d to dst.
func AppendDeadLetter(dst []byte, d *DeadLetter) []byte {
	dst = append(dst, dlVersion)
	dst = binary.AppendUvarint(dst, d.Message.Offset)
	dst = binary.AppendUvarint(dst, uint64(max(d.Attempts, 0)))
	dst = append(dst, d.Reason)
	dst = binary.AppendVarint(dst, wire.TimeNanos(d.FirstDelivery))
	dst = binary.AppendVarint(dst, wire.TimeNanos(d.LastDelivery))
	dst = binary.AppendVarint(dst, wire.TimeNanos(d.DeadAt))
	return AppendMessage(dst, &d.Message)
}

// DecodeDeadLetter decodes what AppendDeadLetter wrote; see DecodeMessage
// for own. It also returns the message's encoding within buf (valid as long
// as buf is, after the copy when own is false).
func DecodeDeadLetter(buf []byte, own bool) (DeadLetter, []byte, error) {
	if !own {
		buf = append([]byte(nil), buf...)
	}
	dec := wire.NewDecoder(buf, ErrBadRecord)
	var d DeadLetter
	if v := dec.Byte(); v != dlVersion {
		if dec.Err() != nil {
			return d, nil, dec.Err()
		}
		return d, nil, fmt.Errorf("%w: dead letter version %d", ErrBadRecord, v)
	}
	offset := dec.Uvarint()
	d.Attempts = int(min(dec.Uvarint(), 1<<31-1))
	d.Reason = dec.Byte()
	d.FirstDelivery = wire.TimeFromNanos(dec.Varint())
	d.LastDelivery = wire.TimeFromNanos(dec.Varint())
	d.DeadAt = wire.TimeFromNanos(dec.Varint())
	if dec.Err() != nil {
		return DeadLetter{}, nil, dec.Err()
	}
	msg := dec.Rest()
	m, err := DecodeMessage(msg, true)
	if err != nil {
		return DeadLetter{}, nil, err
	}
	m.Offset = offset
	d.Message = m
	return d, msg, nil
}
