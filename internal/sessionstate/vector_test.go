package sessionstate

import (
	"encoding/hex"
	"reflect"
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
)

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
