package mqttwire

import (
	"errors"
	"reflect"
	"testing"
)

// allProps sets every field of Properties.
var allProps = Properties{
	PayloadFormat: 1, MessageExpiry: 3600, HasMessageExpiry: true, ContentType: "application/json",
	ResponseTopic: "reply/to", CorrelationData: []byte{0, 1, 2}, SubscriptionIDs: []int{1, 128, MaxRemaining},
	SessionExpiry: 0xffffffff, AssignedClientID: "auto-1", ServerKeepAlive: 20, ReasonString: "because",
	ReceiveMaximum: 65535, TopicAliasMaximum: 10, TopicAlias: 3, MaximumQoS: 1, HasMaximumQoS: true,
	MaximumPacketSize: 1 << 20, User: []UserProperty{{"key", "k1"}, {"", ""}, {"key", "k2"}},
}

func TestPropertiesRoundTrip(t *testing.T) {
	for name, p := range map[string]Properties{
		"none":             {},
		"all":              allProps,
		"zero expiry":      {HasMessageExpiry: true},
		"zero maximum QoS": {HasMaximumQoS: true},
	} {
		b := AppendProperties([]byte{0xee}, &p)
		n, size, err := ReadVarint(b[1:])
		if err != nil || n != p.Len() || 1+size+n != len(b) {
			t.Fatalf("%s: block length %d (%v), Len %d, %d bytes written", name, n, err, p.Len(), len(b)-1)
		}
		raw := RawProperties(b[1+size:])
		if err := raw.Validate(); err != nil {
			t.Fatalf("%s: Validate: %v", name, err)
		}
		got, err := raw.Parse()
		if err != nil || !reflect.DeepEqual(got, p) {
			t.Errorf("%s: Parse = %+v, %v; want %+v", name, got, err, p)
		}
	}
}

func TestPropertiesPresence(t *testing.T) {
	// A value without its Has flag is sent, and comes back with the flag set.
	p := Properties{MessageExpiry: 5, MaximumQoS: 1}
	b := AppendProperties(nil, &p)
	got, err := RawProperties(b[1:]).Parse()
	if err != nil || !reflect.DeepEqual(got, Properties{MessageExpiry: 5, HasMessageExpiry: true, MaximumQoS: 1, HasMaximumQoS: true}) {
		t.Errorf("Parse = %+v, %v", got, err)
	}
}

func TestRawProperties(t *testing.T) {
	b := AppendProperties(nil, &allProps)
	raw := RawProperties(b[VarintLen(allProps.Len()):])
	var ids []byte
	var expiry, subID uint32
	for r := raw; len(r) > 0; {
		p, rest, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.ID)
		switch p.ID {
		case PropMessageExpiry:
			expiry = p.Uint()
		case PropSubscriptionID:
			subID = max(subID, p.Uint())
		}
		r = rest
	}
	if len(ids) != 20 || expiry != 3600 || subID != MaxRemaining {
		t.Errorf("walked ids % x, expiry %d, largest subscription id %d", ids, expiry, subID)
	}
	if v, ok := raw.UserValue("key"); !ok || string(v) != "k1" {
		t.Errorf("UserValue(key) = %q, %v; want the first, k1", v, ok)
	}
	if _, ok := raw.UserValue("absent"); ok {
		t.Error("UserValue(absent) found")
	}
	// Properties without a field are checked and skipped.
	skipped := RawProperties{PropAuthMethod, 0, 1, 'm', PropAuthData, 0, 0, PropWillDelay, 0, 0, 0, 1,
		PropRequestProblemInfo, 0, PropRequestResponseInfo, 1, PropResponseInfo, 0, 0, PropServerReference, 0, 0,
		PropRetainAvailable, 0, PropWildcardAvailable, 0, PropSubscriptionIDAvailable, 0, PropSharedAvailable, 0}
	if p, err := skipped.Parse(); err != nil || !reflect.DeepEqual(p, Properties{}) {
		t.Errorf("skipped properties: %+v, %v", p, err)
	}
	// A later single-valued property replaces an earlier one.
	twice := RawProperties{PropReasonString, 0, 1, 'a', PropReasonString, 0, 1, 'b', PropCorrelationData, 0, 1, 9, PropCorrelationData, 0, 0}
	if p, err := twice.Parse(); err != nil || p.ReasonString != "b" || p.CorrelationData != nil {
		t.Errorf("repeated properties: %+v, %v", p, err)
	}
	for _, bad := range []RawProperties{
		{0x00},
		{0x7f, 1},
		{PropMessageExpiry, 0, 0, 0},
		{PropSubscriptionID, 0x80},
		{PropSubscriptionID, 0x80, 0x80, 0x80, 0x80, 0x01},
		{PropContentType, 0, 2, 'a'},
		{PropUserProperty, 0, 1, 'k', 0},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrMalformed) {
			t.Errorf("Validate(% x): %v", []byte(bad), err)
		}
		if _, err := bad.Parse(); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(% x): %v", []byte(bad), err)
		}
	}
}

func TestPropNames(t *testing.T) {
	for id, k := range propKinds {
		if (k == kindUnknown) != (propNames[id] == "") {
			t.Errorf("property 0x%02x: kind %d, name %q: every known property has a name", id, k, propNames[id])
		}
	}
	if got := PropName(PropTopicAlias); got != "Topic Alias (0x23)" {
		t.Errorf("PropName(0x23) = %q", got)
	}
	if got := PropName(0x7f); got != "unknown property (0x7f)" {
		t.Errorf("PropName(0x7f) = %q", got)
	}
}

func TestRawPropertiesSkip(t *testing.T) {
	b := AppendProperties(nil, &Properties{TopicAlias: 3, User: []UserProperty{{"k", "v"}}})
	r := RawProperties(b[1:])
	var ids []byte
	for len(r) > 0 {
		id, rest, ok := r.Skip()
		if !ok {
			t.Fatalf("Skip failed on % x", r)
		}
		ids, r = append(ids, id), rest
	}
	if string(ids) != string([]byte{PropTopicAlias, PropUserProperty}) {
		t.Fatalf("ids % x", ids)
	}
	for _, bad := range []RawProperties{{0x7f, 0}, {PropTopicAlias, 0}} {
		if _, _, ok := bad.Skip(); ok {
			t.Errorf("Skip(% x) ok", bad)
		}
	}
}
