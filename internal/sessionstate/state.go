// Package sessionstate is the binary encoding of what one node keeps of a
// persistent MQTT session in its session record (sessionstore.Record.State):
// the client, as mochi's storage.Client, and its subscriptions. It is
// written and read field by field, no reflection: restoring 100k sessions
// decodes them all at start (the JSON records it replaces, decoded by
// encoding/json, took 43% of a restart's CPU).
//
// Layout, version 1: the byte 1, then the client (strings and byte slices
// as a uvarint length and the bytes, integers as uvarints, booleans in one
// flags byte), then a uvarint count of subscriptions and each one. A
// decoder refuses a version it does not know and any length running past
// the end, and never allocates more than the input's length for one field.
package sessionstate

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// State is one session's client and subscriptions.
type State struct {
	Client storage.Client
	Subs   []storage.Subscription
}

const version = 1

// ErrCorrupt is returned for a state that cannot be decoded.
var ErrCorrupt = errors.New("sessionstate: cannot decode session state")

// client flags
const (
	fClean = 1 << iota
	fSessionExpiryFlag
	fProblemInfoFlag
	fWillRetain
)

// subscription flags
const (
	sRetainAsPublished = 1 << iota
	sNoLocal
)

// Encode appends st's encoding to dst. The client id and the record types
// are not written: the record's key is the id (Decode restores them).
func Encode(dst []byte, st *State) []byte {
	c := &st.Client
	p := &c.Properties
	dst = append(dst, version)
	var flags byte
	if c.Clean {
		flags |= fClean
	}
	if p.SessionExpiryIntervalFlag {
		flags |= fSessionExpiryFlag
	}
	if p.RequestProblemInfoFlag {
		flags |= fProblemInfoFlag
	}
	if c.Will.Retain {
		flags |= fWillRetain
	}
	dst = append(dst, flags, c.ProtocolVersion, p.RequestProblemInfo, p.RequestResponseInfo, c.Will.Qos)
	dst = appendString(dst, c.Remote)
	dst = appendString(dst, c.Listener)
	dst = appendBytes(dst, c.Username)
	dst = binary.AppendUvarint(dst, uint64(p.SessionExpiryInterval))
	dst = binary.AppendUvarint(dst, uint64(p.MaximumPacketSize))
	dst = binary.AppendUvarint(dst, uint64(p.ReceiveMaximum))
	dst = binary.AppendUvarint(dst, uint64(p.TopicAliasMaximum))
	dst = appendString(dst, p.AuthenticationMethod)
	dst = appendBytes(dst, p.AuthenticationData)
	dst = appendUser(dst, p.User)
	dst = appendString(dst, c.Will.TopicName)
	dst = appendBytes(dst, c.Will.Payload)
	dst = appendUser(dst, c.Will.User)
	dst = binary.AppendUvarint(dst, uint64(c.Will.Flag))
	dst = binary.AppendUvarint(dst, uint64(c.Will.WillDelayInterval))
	dst = binary.AppendUvarint(dst, uint64(len(st.Subs)))
	for i := range st.Subs {
		s := &st.Subs[i]
		var sf byte
		if s.RetainAsPublished {
			sf |= sRetainAsPublished
		}
		if s.NoLocal {
			sf |= sNoLocal
		}
		dst = append(dst, sf, s.Qos, s.RetainHandling)
		dst = binary.AppendVarint(dst, int64(s.Identifier))
		dst = appendString(dst, s.Filter)
	}
	return dst
}

// Decode decodes the state of client id from b; the result shares no
// memory with b.
func Decode(id string, b []byte) (*State, error) {
	d := decoder{b: b}
	if v := d.byte(); v != version && d.err == nil {
		return nil, fmt.Errorf("%w: version %d", ErrCorrupt, v)
	}
	st := &State{}
	c := &st.Client
	p := &c.Properties
	c.ID, c.T = id, storage.ClientKey
	flags := d.byte()
	c.Clean, p.SessionExpiryIntervalFlag, p.RequestProblemInfoFlag, c.Will.Retain =
		flags&fClean != 0, flags&fSessionExpiryFlag != 0, flags&fProblemInfoFlag != 0, flags&fWillRetain != 0
	c.ProtocolVersion, p.RequestProblemInfo, p.RequestResponseInfo, c.Will.Qos = d.byte(), d.byte(), d.byte(), d.byte()
	c.Remote, c.Listener, c.Username = d.string(), d.string(), d.bytes()
	p.SessionExpiryInterval, p.MaximumPacketSize = uint32(d.uint(1<<32-1)), uint32(d.uint(1<<32-1))
	p.ReceiveMaximum, p.TopicAliasMaximum = uint16(d.uint(1<<16-1)), uint16(d.uint(1<<16-1))
	p.AuthenticationMethod, p.AuthenticationData, p.User = d.string(), d.bytes(), d.user()
	c.Will.TopicName, c.Will.Payload, c.Will.User = d.string(), d.bytes(), d.user()
	c.Will.Flag, c.Will.WillDelayInterval = uint32(d.uint(1<<32-1)), uint32(d.uint(1<<32-1))
	n := d.count(3)
	if n > 0 {
		st.Subs = make([]storage.Subscription, n)
	}
	for i := range st.Subs {
		s := &st.Subs[i]
		sf := d.byte()
		s.RetainAsPublished, s.NoLocal = sf&sRetainAsPublished != 0, sf&sNoLocal != 0
		s.Qos, s.RetainHandling = d.byte(), d.byte()
		s.Identifier = int(d.int())
		s.Filter = d.string()
		s.ID, s.T, s.Client = s.Filter, storage.SubscriptionKey, id
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d bytes after the end", ErrCorrupt, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return st, nil
}

// FromJSON converts one session's records as keylines before data format
// 3 stored them (mochi's storage.Client and storage.Subscription, JSON) to
// its encoded state. Subscriptions of another client are refused.
func FromJSON(client []byte, subs [][]byte) ([]byte, error) {
	var st State
	if err := json.Unmarshal(client, &st.Client); err != nil {
		return nil, fmt.Errorf("sessionstate: client record: %w", err)
	}
	for _, raw := range subs {
		var s storage.Subscription
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("sessionstate: subscription record of %q: %w", st.Client.ID, err)
		}
		if s.Client != st.Client.ID {
			return nil, fmt.Errorf("sessionstate: subscription %q of client %q stored under client %q", s.Filter, s.Client, st.Client.ID)
		}
		st.Subs = append(st.Subs, s)
	}
	return Encode(nil, &st), nil
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

func appendBytes(dst []byte, b []byte) []byte {
	if b == nil { // nil and empty differ (a username of zero bytes is one)
		return append(dst, 0)
	}
	return append(binary.AppendUvarint(dst, uint64(len(b))+1), b...)
}

func appendUser(dst []byte, ps []packets.UserProperty) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ps)))
	for _, u := range ps {
		dst = appendString(appendString(dst, u.Key), u.Val)
	}
	return dst
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uint(limit uint64) uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > limit {
		d.fail("bad integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 || v < -1<<31 || v > 1<<31-1 {
		d.fail("bad integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items each at least min bytes long.
func (d *decoder) count(min int) int {
	n := d.uint(uint64(len(d.b)))
	if n*uint64(min) > uint64(len(d.b)) {
		d.fail("count past the end")
		return 0
	}
	return int(n)
}

func (d *decoder) raw(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail("length past the end")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.raw(d.uint(uint64(len(d.b))))) }

func (d *decoder) bytes() []byte {
	n := d.uint(uint64(len(d.b)) + 1)
	if n == 0 {
		return nil
	}
	return append([]byte{}, d.raw(n-1)...)
}

func (d *decoder) user() []packets.UserProperty {
	n := d.count(2)
	if n == 0 {
		return nil
	}
	ps := make([]packets.UserProperty, n)
	for i := range ps {
		ps[i] = packets.UserProperty{Key: d.string(), Val: d.string()}
	}
	return ps
}
