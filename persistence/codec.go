package persistence

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence/seglog"
)

// errDecode is wrapped by every decoding error; loading a group turns it into ErrCorrupt.
var errDecode = errors.New("malformed record")

const (
	msgVersion   = 1
	dlVersion    = 1
	stateVersion = 3
)

// Message flags.
const (
	flagKeyIsTopic    = 1 << 0 // the key equals the topic and is not stored
	flagPayloadFormat = 1 << 1 // a payload format byte follows the QoS
	flagProps         = 1 << 2 // content type, response topic, correlation data and user properties follow the key
)

// A log entry (the value under a big-endian uint64 offset) is:
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
// A message encodes to messageSize(m) bytes; that size is what the byte limits count.

func hasProps(p *keyshared.Properties) bool {
	return p.ContentType != "" || p.ResponseTopic != "" || len(p.CorrelationData) > 0 || len(p.User) > 0
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func varintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return uvarintLen(ux)
}

func strLen(n int) int { return uvarintLen(uint64(n)) + n }

// messageSize returns the encoded size of m.
func messageSize(m *keyshared.Message) int {
	n := 3 + varintLen(timeNanos(m.PublishedAt)) + varintLen(timeNanos(m.ExpiresAt)) + strLen(len(m.Topic))
	if m.Props.PayloadFormatSet {
		n++
	}
	if m.Key != m.Topic {
		n += strLen(len(m.Key))
	}
	if p := &m.Props; hasProps(p) {
		n += strLen(len(p.ContentType)) + strLen(len(p.ResponseTopic)) + strLen(len(p.CorrelationData))
		n += uvarintLen(uint64(len(p.User)))
		for _, u := range p.User {
			n += strLen(len(u.Key)) + strLen(len(u.Val))
		}
	}
	return n + len(m.Payload)
}

// appendMessage appends the encoding of m to dst.
func appendMessage(dst []byte, m *keyshared.Message) []byte {
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
	dst = binary.AppendVarint(dst, timeNanos(m.PublishedAt))
	dst = binary.AppendVarint(dst, timeNanos(m.ExpiresAt))
	dst = appendString(dst, m.Topic)
	if flags&flagKeyIsTopic == 0 {
		dst = appendString(dst, m.Key)
	}
	if flags&flagProps != 0 {
		dst = appendString(dst, p.ContentType)
		dst = appendString(dst, p.ResponseTopic)
		dst = binary.AppendUvarint(dst, uint64(len(p.CorrelationData)))
		dst = append(dst, p.CorrelationData...)
		dst = binary.AppendUvarint(dst, uint64(len(p.User)))
		for _, u := range p.User {
			dst = appendString(dst, u.Key)
			dst = appendString(dst, u.Val)
		}
	}
	return append(dst, m.Payload...)
}

// encodeMessage returns the encoding of m in a new slice of exactly its size.
func encodeMessage(m *keyshared.Message) []byte {
	return appendMessage(make([]byte, 0, messageSize(m)), m)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decodeMessage decodes a log entry. With own set, buf belongs to the caller
// for good: strings and slices of the result point into it, so it must never be
// written again. Otherwise (buf is bbolt memory valid only inside its
// transaction) buf is first copied once, and the message points into the copy.
func decodeMessage(buf []byte, own bool) (keyshared.Message, error) {
	if !own {
		buf = append([]byte(nil), buf...)
	}
	d := decoder{b: buf}
	var m keyshared.Message
	if v := d.byte(); v != msgVersion {
		if d.err != nil {
			return m, d.err
		}
		return m, fmt.Errorf("%w: message version %d", errDecode, v)
	}
	flags := d.byte()
	m.QoS = d.byte()
	if flags&flagPayloadFormat != 0 {
		m.Props.PayloadFormat = d.byte()
		m.Props.PayloadFormatSet = true
	}
	m.PublishedAt = timeFromNanos(d.varint())
	m.ExpiresAt = timeFromNanos(d.varint())
	// Topic and key are copied out of buf: a Key-Shared window keeps a key
	// (and its map entry) for a while after its last message resolved, and
	// a view would keep the whole record, payload included, alive with it.
	// One allocation holds both.
	topic := d.bytes()
	if flags&flagKeyIsTopic != 0 {
		m.Topic = string(topic)
		m.Key = m.Topic
	} else {
		key := d.bytes()
		both := string(topic) + string(key)
		m.Topic, m.Key = both[:len(topic)], both[len(topic):]
	}
	if flags&flagProps != 0 {
		m.Props.ContentType = d.string()
		m.Props.ResponseTopic = d.string()
		m.Props.CorrelationData = d.bytes()
		n := d.uvarint()
		if n > uint64(len(d.b)) { // every property takes at least two bytes
			d.fail("user property count")
		} else if n > 0 {
			m.Props.User = make([]keyshared.UserProperty, n)
			for i := range m.Props.User {
				m.Props.User[i] = keyshared.UserProperty{Key: d.string(), Val: d.string()}
			}
		}
	}
	if d.err != nil {
		return keyshared.Message{}, d.err
	}
	if len(d.b) > 0 {
		m.Payload = d.b[:len(d.b):len(d.b)] // capped: an append by the reader copies
	}
	return m, nil
}

// A dead letter (the value under a big-endian uint64 id in a group's dlq bucket) is:
//
//	version      byte (1)
//	offset       uvarint  (the message's offset in the log when it died)
//	attempts     uvarint
//	reason       byte
//	first, last, dead  varint unix nanoseconds each (0 = zero time)
//	message      a log entry, as above, to the end of the value
func appendDeadLetter(dst []byte, d *keyshared.DeadLetter) []byte {
	dst = append(dst, dlVersion)
	dst = binary.AppendUvarint(dst, d.Message.Offset)
	dst = binary.AppendUvarint(dst, uint64(max(d.Attempts, 0)))
	dst = append(dst, d.Reason)
	dst = binary.AppendVarint(dst, timeNanos(d.FirstDelivery))
	dst = binary.AppendVarint(dst, timeNanos(d.LastDelivery))
	dst = binary.AppendVarint(dst, timeNanos(d.DeadAt))
	return appendMessage(dst, &d.Message)
}

// decodeDeadLetter decodes a dead letter; see decodeMessage for own. It also
// returns the message's encoding within buf (valid as long as buf is).
func decodeDeadLetter(buf []byte, own bool) (keyshared.DeadLetter, []byte, error) {
	if !own {
		buf = append([]byte(nil), buf...)
	}
	dec := decoder{b: buf}
	var d keyshared.DeadLetter
	if v := dec.byte(); v != dlVersion {
		if dec.err != nil {
			return d, nil, dec.err
		}
		return d, nil, fmt.Errorf("%w: dead letter version %d", errDecode, v)
	}
	offset := dec.uvarint()
	d.Attempts = int(min(dec.uvarint(), 1<<31-1))
	d.Reason = dec.byte()
	d.FirstDelivery = timeFromNanos(dec.varint())
	d.LastDelivery = timeFromNanos(dec.varint())
	d.DeadAt = timeFromNanos(dec.varint())
	if dec.err != nil {
		return keyshared.DeadLetter{}, nil, dec.err
	}
	msg := dec.b
	m, err := decodeMessage(msg, true)
	if err != nil {
		return keyshared.DeadLetter{}, nil, err
	}
	m.Offset = offset
	d.Message = m
	return d, msg, nil
}

// groupState is a group's checkpoint, stored under "state" in the group's
// bucket and rewritten by each checkpoint that changes it:
//
//	version byte (3), then uvarints: head, cursor, dropped, then varint last
//	seen, byte active, uvarint count of resolved ranges above the cursor,
//	and each as uvarint gap from the previous range's end (the cursor for
//	the first) and uvarint length - 1; then uvarint lost.
//
// Version 2 (data format 1) is the same without lost; it is read as lost 0.
// A keyline of data format 1 refuses version 3 (it reads the group as
// corrupt), so it cannot open a data dir a newer keyline wrote.
//
// The messages themselves live in the segment log (package seglog), which
// recovers the rest from the checkpoint.
type groupState struct {
	seglog.GroupState
	// lastSeen is when the group last had members, in unix nanoseconds.
	lastSeen int64
	// active records whether the group had members at the last checkpoint.
	active bool
}

func (st *groupState) encode() []byte {
	b := make([]byte, 0, 48+8*len(st.Resolved))
	b = append(b, stateVersion)
	for _, v := range [...]uint64{st.Head, st.Cursor, st.Dropped} {
		b = binary.AppendUvarint(b, v)
	}
	b = binary.AppendVarint(b, st.lastSeen)
	if st.active {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(st.Resolved)))
	prev := st.Cursor
	for _, r := range st.Resolved {
		b = binary.AppendUvarint(b, r.First-prev)
		b = binary.AppendUvarint(b, r.Last-r.First)
		prev = r.Last
	}
	return binary.AppendUvarint(b, st.Lost)
}

func decodeState(buf []byte) (groupState, error) {
	d := decoder{b: buf}
	var st groupState
	v := d.byte()
	if v != stateVersion && v != 2 {
		if d.err != nil {
			return st, d.err
		}
		if v == 1 {
			return st, fmt.Errorf("%w: state version 1: written by an earlier keyline that kept group logs in this file; start with an empty data dir", errDecode)
		}
		return st, fmt.Errorf("%w: state version %d", errDecode, v)
	}
	for _, p := range [...]*uint64{&st.Head, &st.Cursor, &st.Dropped} {
		*p = d.uvarint()
	}
	st.lastSeen = d.varint()
	st.active = d.byte() == 1
	n := d.uvarint()
	if d.err == nil && n > uint64(len(buf)) {
		return groupState{}, fmt.Errorf("%w: %d resolved ranges in %d bytes", errDecode, n, len(buf))
	}
	prev := st.Cursor
	for range n {
		first := prev + d.uvarint()
		last := first + d.uvarint()
		if d.err != nil {
			break
		}
		if first <= prev+1 || last > st.Head || last < first {
			return groupState{}, fmt.Errorf("%w: resolved range %d..%d after %d (head %d)", errDecode, first, last, prev, st.Head)
		}
		st.Resolved = append(st.Resolved, seglog.Range{First: first, Last: last})
		prev = last
	}
	if v >= 3 {
		st.Lost = d.uvarint()
	}
	if d.err != nil {
		return groupState{}, d.err
	}
	if st.Cursor > st.Head {
		return groupState{}, fmt.Errorf("%w: inconsistent state head=%d cursor=%d", errDecode, st.Head, st.Cursor)
	}
	return st, nil
}

// dlqState counts a group's dead letters, stored under "dlq-state" and
// written in the transaction of every dead-letter operation:
//
//	uvarint dead letters held, uvarint last id handed out (ids are never reused)
type dlqState struct {
	count, seq uint64
}

func (d dlqState) encode() []byte {
	return binary.AppendUvarint(binary.AppendUvarint(make([]byte, 0, 20), d.count), d.seq)
}

func decodeDLQState(buf []byte) (dlqState, error) {
	d := decoder{b: buf}
	st := dlqState{count: d.uvarint(), seq: d.uvarint()}
	if d.err != nil {
		return dlqState{}, d.err
	}
	if st.count > st.seq {
		return dlqState{}, fmt.Errorf("%w: %d dead letters but last id %d", errDecode, st.count, st.seq)
	}
	return st, nil
}

// groupMeta is a group's identity and settings, stored as JSON under "meta".
type groupMeta struct {
	// ID names the group in the segment log; ids are never reused.
	ID      uint64      `json:"id"`
	Share   string      `json:"share"`
	Filter  string      `json:"filter"`
	Created time.Time   `json:"created"`
	Config  GroupConfig `json:"config"`
}

func (m *groupMeta) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("persistence: encode group meta: %w", err)
	}
	return b, nil
}

func decodeMeta(buf []byte) (groupMeta, error) {
	var m groupMeta
	if err := json.Unmarshal(buf, &m); err != nil {
		return m, fmt.Errorf("%w: meta: %v", errDecode, err)
	}
	return m, nil
}

// timeNanos encodes t as unix nanoseconds, 0 for the zero time (the Unix epoch
// itself therefore reads back as the zero time). Times outside the range of
// int64 nanoseconds (years 1678 to 2262) are clamped.
func timeNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	const maxSec = (1<<63-1)/int64(time.Second) - 1
	if s := t.Unix(); s >= maxSec {
		return 1<<63 - 1
	} else if s <= -maxSec {
		return -1 << 63
	}
	return t.UnixNano()
}

func timeFromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), v) }

// decoder reads a record, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or bad %s", errDecode, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("byte")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// bytes returns a length-prefixed field as a capped sub-slice of the buffer, nil if empty.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("length")
		return nil
	}
	if n == 0 {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// string returns a length-prefixed field as a string that shares the
// buffer's memory: decodeMessage's callers never write the buffer after
// decoding. It is used for the fields a message needs only as long as its
// payload (content type, response topic, user properties), so the view keeps
// nothing alive that the message does not keep anyway; topic and key, which
// outlive the message in a Key-Shared window, are copied.
func (d *decoder) string() string {
	b := d.bytes()
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// EncodeMessage returns the log encoding of m (its Offset is not part of
// it). A cluster group log stores messages in this form too.
func EncodeMessage(m *keyshared.Message) []byte { return encodeMessage(m) }

// DecodeMessage decodes what EncodeMessage returned. The message's strings
// and slices point into buf, which must not be written again.
func DecodeMessage(buf []byte) (keyshared.Message, error) { return decodeMessage(buf, true) }

// EncodeDeadLetter returns the stored encoding of a dead letter (its
// message's offset included, its group not).
func EncodeDeadLetter(d *keyshared.DeadLetter) []byte { return appendDeadLetter(nil, d) }

// DecodeDeadLetter decodes what EncodeDeadLetter returned; see DecodeMessage for buf.
func DecodeDeadLetter(buf []byte) (keyshared.DeadLetter, error) {
	d, _, err := decodeDeadLetter(buf, true)
	return d, err
}
