package sessionstate

import (
	"encoding/json"
	"errors"
	"reflect"
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
		Subs: []storage.Subscription{
			{T: storage.SubscriptionKey, ID: "a/#", Client: id, Filter: "a/#", Identifier: 268435455, RetainHandling: 2, Qos: 1, RetainAsPublished: true, NoLocal: true},
			{T: storage.SubscriptionKey, ID: "$share/g/b", Client: id, Filter: "$share/g/b", Qos: 0},
		},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, st := range []*State{full(), {Client: storage.Client{ID: "e", T: storage.ClientKey, Username: []byte{}}}} {
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
		raw, _ := json.Marshal(s)
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
	b := Encode(nil, full())
	for i := range len(b) {
		if _, err := Decode("x", b[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("prefix of %d bytes: %v, want ErrCorrupt", i, err)
		}
		c := append([]byte{}, b...)
		c[i] = 0xff
		_, _ = Decode("x", c) // must not panic
	}
	if _, err := Decode("x", append(b, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a trailing byte: %v, want ErrCorrupt", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(nil, full()))
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
