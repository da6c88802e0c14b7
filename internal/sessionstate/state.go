// Package sessionstate is the binary encoding of what one node keeps of a
// persistent MQTT session in its session record (sessionstore.Record.State):
// the client, as mochi's storage.Client, and its subscriptions, and in
// cluster mode where each subscription starts in KL_MSGS, the key filters
// of its shared subscriptions and which run of a node wrote the will. It is
// written and read field by field, no reflection: restoring 100k sessions
// decodes them all at start (the JSON records it replaces, decoded by
// encoding/json, took 43% of a restart's CPU).
//
// Layout, version 1: the byte 1, then the client (strings and byte slices
// as a uvarint length and the bytes (internal/wire), integers as uvarints,
// booleans and which byte slices are not nil in one flags byte), then a
// uvarint count of subscriptions and each one (a flags byte, QoS, retain
// handling, identifier, filter, then its Since as a uvarint when its flag
// sSince is set). When the client flag fMore is set, a second flags byte
// follows the subscriptions, naming the optional sections after it: the
// key filters (xKeyFilters: a uvarint count of shared subscriptions, each
// its filter and its list of key filters, a count and the strings, in
// filter order), then the will's run (xWillRun: a string). A state without
// Since, key filters and will run (single-node mode) sets none of these
// flags, so its bytes are those of before they existed. The decoder refuses a
// version or a flag it does not know, any length or count running past the
// end and trailing bytes, and allocates no more than the input's length.
package sessionstate

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/wire"
)

// State is one session's client and subscriptions.
type State struct {
	Client storage.Client
	Subs   []Sub
	// KeyFilters are the key filters of its shared subscriptions, by
	// subscription filter (cluster mode keeps them in the session's record;
	// single-node mode in a bucket of its own). Nil when there are none; an
	// empty list decodes as nil.
	KeyFilters map[string][]string
	// WillRun is, in cluster mode, the run of the node that wrote the will
	// (Client.Will, kept there while it may still be sent); "" on one node.
	WillRun string
}

// Sub is a stored subscription. Since is, in cluster mode, the last KL_MSGS
// sequence when it was made (older messages are not for it); zero in
// single-node mode.
type Sub struct {
	storage.Subscription
	Since uint64
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
	// The byte slices that are not nil (nil and empty differ: a username
	// of zero bytes is one).
	fUsername
	fAuthData
	fWillPayload
	// A flags byte of optional sections (x...) follows the subscriptions.
	fMore
)

// optional sections, in their order
const (
	xKeyFilters = 1 << iota
	xWillRun

	xKnown = xKeyFilters | xWillRun
)

// subscription flags
const (
	sRetainAsPublished = 1 << iota
	sNoLocal
	sSince // a uvarint Since follows the filter

	sKnown = sRetainAsPublished | sNoLocal | sSince
)

func flag(on bool, f byte) byte {
	if on {
		return f
	}
	return 0
}

// Encode appends st's encoding to dst. The client id and the record types
// are not written: the record's key is the id (Decode restores them).
func Encode(dst []byte, st *State) []byte {
	c := &st.Client
	p := &c.Properties
	dst = append(dst, version,
		flag(c.Clean, fClean)|flag(p.SessionExpiryIntervalFlag, fSessionExpiryFlag)|
			flag(p.RequestProblemInfoFlag, fProblemInfoFlag)|flag(c.Will.Retain, fWillRetain)|
			flag(c.Username != nil, fUsername)|flag(p.AuthenticationData != nil, fAuthData)|
			flag(c.Will.Payload != nil, fWillPayload)|flag(len(st.KeyFilters) > 0 || st.WillRun != "", fMore),
		c.ProtocolVersion, p.RequestProblemInfo, p.RequestResponseInfo, c.Will.Qos)
	dst = wire.AppendString(dst, c.Remote)
	dst = wire.AppendString(dst, c.Listener)
	dst = wire.AppendBytes(dst, c.Username)
	dst = binary.AppendUvarint(dst, uint64(p.SessionExpiryInterval))
	dst = binary.AppendUvarint(dst, uint64(p.MaximumPacketSize))
	dst = binary.AppendUvarint(dst, uint64(p.ReceiveMaximum))
	dst = binary.AppendUvarint(dst, uint64(p.TopicAliasMaximum))
	dst = wire.AppendString(dst, p.AuthenticationMethod)
	dst = wire.AppendBytes(dst, p.AuthenticationData)
	dst = appendUser(dst, p.User)
	dst = wire.AppendString(dst, c.Will.TopicName)
	dst = wire.AppendBytes(dst, c.Will.Payload)
	dst = appendUser(dst, c.Will.User)
	dst = binary.AppendUvarint(dst, uint64(c.Will.Flag))
	dst = binary.AppendUvarint(dst, uint64(c.Will.WillDelayInterval))
	dst = binary.AppendUvarint(dst, uint64(len(st.Subs)))
	for i := range st.Subs {
		s := &st.Subs[i]
		dst = append(dst, flag(s.RetainAsPublished, sRetainAsPublished)|flag(s.NoLocal, sNoLocal)|flag(s.Since != 0, sSince),
			s.Qos, s.RetainHandling)
		dst = binary.AppendVarint(dst, int64(s.Identifier))
		dst = wire.AppendString(dst, s.Filter)
		if s.Since != 0 {
			dst = binary.AppendUvarint(dst, s.Since)
		}
	}
	more := flag(len(st.KeyFilters) > 0, xKeyFilters) | flag(st.WillRun != "", xWillRun)
	if more == 0 {
		return dst
	}
	dst = append(dst, more)
	if more&xKeyFilters != 0 {
		dst = appendKeyFilters(dst, st.KeyFilters)
	}
	if more&xWillRun != 0 {
		dst = wire.AppendString(dst, st.WillRun)
	}
	return dst
}

func appendKeyFilters(dst []byte, m map[string][]string) []byte {
	filters := make([]string, 0, len(m))
	for f := range m {
		filters = append(filters, f)
	}
	slices.Sort(filters)
	dst = binary.AppendUvarint(dst, uint64(len(filters)))
	for _, f := range filters {
		dst = wire.AppendString(dst, f)
		kf := m[f]
		dst = binary.AppendUvarint(dst, uint64(len(kf)))
		for _, k := range kf {
			dst = wire.AppendString(dst, k)
		}
	}
	return dst
}

// Decode decodes the state of client id from b; the result shares no
// memory with b.
func Decode(id string, b []byte) (*State, error) {
	d := wire.NewDecoder(b, ErrCorrupt)
	if v := d.Byte(); v != version && d.Err() == nil {
		return nil, fmt.Errorf("%w: version %d", ErrCorrupt, v)
	}
	st := &State{}
	c := &st.Client
	p := &c.Properties
	c.ID, c.T = id, storage.ClientKey
	flags := d.Byte()
	c.Clean, p.SessionExpiryIntervalFlag, p.RequestProblemInfoFlag, c.Will.Retain =
		flags&fClean != 0, flags&fSessionExpiryFlag != 0, flags&fProblemInfoFlag != 0, flags&fWillRetain != 0
	c.ProtocolVersion, p.RequestProblemInfo, p.RequestResponseInfo, c.Will.Qos = d.Byte(), d.Byte(), d.Byte(), d.Byte()
	c.Remote, c.Listener, c.Username = d.String(), d.String(), bytesCopy(d, flags&fUsername != 0)
	p.SessionExpiryInterval, p.MaximumPacketSize = uint32(limit(d, math.MaxUint32)), uint32(limit(d, math.MaxUint32))
	p.ReceiveMaximum, p.TopicAliasMaximum = uint16(limit(d, math.MaxUint16)), uint16(limit(d, math.MaxUint16))
	p.AuthenticationMethod, p.AuthenticationData, p.User = d.String(), bytesCopy(d, flags&fAuthData != 0), user(d)
	c.Will.TopicName, c.Will.Payload, c.Will.User = d.String(), bytesCopy(d, flags&fWillPayload != 0), user(d)
	c.Will.Flag, c.Will.WillDelayInterval = uint32(limit(d, math.MaxUint32)), uint32(limit(d, math.MaxUint32))
	if n := d.Count(); n > 0 {
		st.Subs = make([]Sub, n)
	}
	for i := range st.Subs {
		s := &st.Subs[i]
		sf := d.Byte()
		if sf&^sKnown != 0 && d.Err() == nil {
			return nil, fmt.Errorf("%w: subscription flags %#x", ErrCorrupt, sf)
		}
		s.RetainAsPublished, s.NoLocal = sf&sRetainAsPublished != 0, sf&sNoLocal != 0
		s.Qos, s.RetainHandling = d.Byte(), d.Byte()
		if sid := d.Varint(); sid < math.MinInt32 || sid > math.MaxInt32 {
			d.Fail("subscription identifier")
		} else {
			s.Identifier = int(sid)
		}
		s.Filter = d.String()
		s.ID, s.T, s.Client = s.Filter, storage.SubscriptionKey, id
		if sf&sSince != 0 {
			if s.Since = d.Uvarint(); s.Since == 0 {
				d.Fail("subscription start (zero under its flag)")
			}
		}
	}
	if flags&fMore != 0 {
		more := d.Byte()
		if (more == 0 || more&^xKnown != 0) && d.Err() == nil {
			return nil, fmt.Errorf("%w: optional sections %#x", ErrCorrupt, more)
		}
		if more&xKeyFilters != 0 {
			st.KeyFilters = keyFilters(d)
		}
		if more&xWillRun != 0 {
			if st.WillRun = d.String(); st.WillRun == "" {
				d.Fail("will run (empty under its flag)")
			}
		}
	}
	if err := d.Done(); err != nil {
		return nil, err
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
		st.Subs = append(st.Subs, Sub{Subscription: s})
	}
	return Encode(nil, &st), nil
}

func appendUser(dst []byte, ps []packets.UserProperty) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ps)))
	for _, u := range ps {
		dst = wire.AppendString(wire.AppendString(dst, u.Key), u.Val)
	}
	return dst
}

// limit reads a uvarint of at most max.
func limit(d *wire.Decoder, max uint64) uint64 {
	v := d.Uvarint()
	if v > max {
		d.Fail("integer")
		return 0
	}
	return v
}

// bytesCopy reads a byte slice as a copy: nil unless set.
func bytesCopy(d *wire.Decoder, set bool) []byte {
	b := d.Bytes()
	if !set {
		return nil
	}
	return append([]byte{}, b...)
}

// keyFilters reads the key filters section: at least one subscription
// filter, each once, in order (so a state has one encoding).
func keyFilters(d *wire.Decoder) map[string][]string {
	n := d.Count()
	if n == 0 {
		d.Fail("key filters (an empty section)")
		return nil
	}
	m := make(map[string][]string, n)
	prev := ""
	for i := range n {
		f := d.String()
		if i > 0 && f <= prev {
			d.Fail("key filters (out of order)")
			return nil
		}
		prev = f
		var kf []string
		if k := d.Count(); k > 0 {
			kf = make([]string, k)
			for j := range kf {
				kf[j] = d.String()
			}
		}
		m[f] = kf
		if d.Err() != nil {
			return nil
		}
	}
	return m
}

func user(d *wire.Decoder) []packets.UserProperty {
	n := d.Count()
	if n == 0 {
		return nil
	}
	ps := make([]packets.UserProperty, n)
	for i := range ps {
		ps[i] = packets.UserProperty{Key: d.String(), Val: d.String()}
	}
	return ps
}
