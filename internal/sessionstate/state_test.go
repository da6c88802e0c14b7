package sessionstate

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

func full() *State {
	id := "dev-ünï/1"
	return &State{
		Client: storage.Client{
			ID: id, T: storage.ClientKey, Remote: "127.0.0.1:5555", Listener: "tcp", Username: []byte("user"),
			Clean: true, ProtocolVersion: 5,
			Properties: storage.ClientProperties{
				AuthenticationData: []byte{0, 1, 2}, User: []packets.UserProperty{{Key: "k", Val: "v"}, {Key: "", Val: "x"}},
				AuthenticationMethod: "SCRAM", SessionExpiryInterval: 1<<32 - 1, MaximumPacketSize: 1 << 20,
				ReceiveMaximum: 65535, TopicAliasMaximum: 10, SessionExpiryIntervalFlag: true,
				RequestProblemInfo: 1, RequestProblemInfoFlag: true, RequestResponseInfo: 1,
			},
			Will: storage.ClientWill{
				Payload: []byte("gone"), User: []packets.UserProperty{{Key: "w", Val: "1"}}, TopicName: "lwt/x",
				Flag: 1, WillDelayInterval: 30, Qos: 2, Retain: true,
			},
		},
		Subs: []Sub{
			{Subscription: storage.Subscription{T: storage.SubscriptionKey, ID: "a/#", Client: id, Filter: "a/#", Identifier: 268435455, RetainHandling: 2, Qos: 1, RetainAsPublished: true, NoLocal: true}},
			{Subscription: storage.Subscription{T: storage.SubscriptionKey, ID: "$share/g/b", Client: id, Filter: "$share/g/b", Qos: 0}},
		},
	}
}

// clustered is full() as cluster mode stores it: where each subscription
// starts in KL_MSGS and the key filters of its shared ones.
func clustered() *State {
	st := full()
	st.Subs[0].Since = 1<<64 - 1
	st.Subs = append(st.Subs, Sub{Subscription: storage.Subscription{T: storage.SubscriptionKey, ID: "$share/h/c", Client: st.Client.ID, Filter: "$share/h/c", Qos: 2}, Since: 7})
	st.KeyFilters = map[string][]string{"$share/g/b": {"k1", "k/+"}, "$share/h/c": {""}, "": nil}
	st.WillRun = "0123456789abcdef"
	return st
}

func TestRoundTrip(t *testing.T) {
	willOnly := full()
	willOnly.WillRun = "r"
	for _, st := range []*State{full(), clustered(), willOnly, {Client: storage.Client{ID: "e", T: storage.ClientKey, Username: []byte{}}}} {
		b := Encode(nil, st)
		got, err := Decode(st.Client.ID, b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, st) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, st)
		}
		b[len(b)-1] ^= 0xff // decoding copied everything out of b
		if !reflect.DeepEqual(got, st) {
			t.Fatal("the decoded state shares memory with its encoding")
		}
	}
}

// TestFromJSON: the records a keyline before data format 3 wrote (mochi's
// JSON encoding of storage.Client and storage.Subscription) convert to the
// same state.
func TestFromJSON(t *testing.T) {
	st := full()
	client, _ := st.Client.MarshalBinary()
	var subs [][]byte
	for _, s := range st.Subs {
		raw, _ := json.Marshal(s.Subscription)
		subs = append(subs, raw)
	}
	b, err := FromJSON(client, subs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(st.Client.ID, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("converted\n%+v\nwant\n%+v", got, st)
	}
	other, _ := json.Marshal(storage.Subscription{Client: "someone else", Filter: "x"})
	if _, err := FromJSON(client, [][]byte{other}); err == nil {
		t.Fatal("a subscription of another client was taken")
	}
}

// TestTruncated: every prefix of an encoding, and every one-byte change of
// a length, fails cleanly (ErrCorrupt) or decodes; nothing panics.
func TestTruncated(t *testing.T) {
	for _, st := range []*State{full(), clustered()} {
		b := Encode(nil, st)
		for i := range len(b) {
			if _, err := Decode("x", b[:i]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("prefix of %d bytes: %v, want ErrCorrupt", i, err)
			}
			for _, v := range []byte{0xff, 0x00, b[i] ^ 0x04} {
				c := append([]byte{}, b...)
				c[i] = v
				if _, err := Decode("x", c); err != nil && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("byte %d set to %#x: %v, want ErrCorrupt or a state", i, v, err)
				}
			}
		}
		if _, err := Decode("x", append(b, 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a trailing byte: %v, want ErrCorrupt", err)
		}
	}
}

// TestRefused: what an encoder of this version never writes is refused, not
// guessed at: subscription flags or optional sections it does not know, a
// Since of zero or an empty will run under its flag, an empty flags byte of
// optional sections, and key filters that are none, out of order or repeat
// a filter.
func TestRefused(t *testing.T) {
	one := func(kf map[string][]string) []byte {
		return Encode(nil, &State{
			Client:     storage.Client{ProtocolVersion: 5},
			Subs:       []Sub{{Subscription: storage.Subscription{Filter: "f"}, Since: 3}},
			KeyFilters: kf,
		})
	}
	// version, client flags, then a client of protocol 5 and nothing else:
	// 3 bytes, will QoS, remote, listener, username, 4 integers, method, data,
	// user properties, will topic, payload, user properties and 2 integers
	base := []byte{1, fMore, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	sub := []byte{1, sSince, 0, 0, 0, 1, 'f', 3} // one subscription with its Since
	cat := func(parts ...[]byte) []byte { return slices.Concat(append([][]byte{base}, parts...)...) }
	if b := cat(sub, []byte{xKeyFilters, 1, 1, 'f', 1, 1, 'k'}); !slices.Equal(b, one(map[string][]string{"f": {"k"}})) {
		t.Fatalf("the layout this test assumes is not the encoder's:\n%x\n%x", b, one(map[string][]string{"f": {"k"}}))
	}
	for name, b := range map[string][]byte{
		"unknown subscription flag":  cat([]byte{1, sSince | 0x08, 0, 0, 0, 1, 'f', 3}, []byte{xKeyFilters, 1, 1, 'f', 0}),
		"zero since under its flag":  cat([]byte{1, sSince, 0, 0, 0, 1, 'f', 0}, []byte{xKeyFilters, 1, 1, 'f', 0}),
		"no optional section":        cat(sub, []byte{0}),
		"unknown optional section":   cat(sub, []byte{xKnown + 1, 1, 1, 'f', 0}),
		"empty key filters":          cat(sub, []byte{xKeyFilters, 0}),
		"key filters out of order":   cat(sub, []byte{xKeyFilters, 2, 1, 'g', 0, 1, 'f', 0}),
		"key filters repeated":       cat(sub, []byte{xKeyFilters, 2, 1, 'f', 0, 1, 'f', 0}),
		"key filters count past end": cat(sub, []byte{xKeyFilters, 1, 1, 'f', 9, 1, 'k'}),
		"empty will run":             cat(sub, []byte{xWillRun, 0}),
	} {
		if st, err := Decode("x", b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %+v, %v; want ErrCorrupt", name, st, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(nil, full()))
	f.Add(Encode(nil, clustered()))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := Decode("x", b)
		if err != nil {
			return
		}
		if again, err := Decode("x", Encode(nil, st)); err != nil || !reflect.DeepEqual(again, st) {
			t.Fatalf("re-encoding a decoded state: %v", err)
		}
	})
}

// TestFixedVectors: the bytes of version 1 as single-node mode writes them
// (data format 3) do not change. Records on disk hold them: a change here
// is a data format change, not a refactoring.
func TestFixedVectors(t *testing.T) {
	for _, tc := range []struct {
		st  *State
		hex string
	}{{
		full(),
		"017f050101020e3132372e302e302e313a35353535037463700475736572ffffffff0f808040ffff030a05534352414d030001020201" +
			"6b0176000178056c77742f7804676f6e650101770131011e02030102feffffff0103612f23000000000a2473686172652f672f62",
	}, {
		&State{Client: storage.Client{ID: "e", T: storage.ClientKey, Listener: "tcp", ProtocolVersion: 4},
			Subs: []Sub{{Subscription: storage.Subscription{T: storage.SubscriptionKey, ID: "a/+", Client: "e", Filter: "a/+", Qos: 1}}}},
		"010004000000000374637000000000000000000000000000010001000003612f2b",
	}} {
		if got := hex.EncodeToString(Encode(nil, tc.st)); got != tc.hex {
			t.Fatalf("encoding of %s changed:\n got %s\nwant %s", tc.st.Client.ID, got, tc.hex)
		}
		b, _ := hex.DecodeString(tc.hex)
		got, err := Decode(tc.st.Client.ID, b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.st) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, tc.st)
		}
	}
}
