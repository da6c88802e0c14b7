package sessionstate

import (
	"errors"
	"reflect"
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// legacyJSON is a state as cluster mode wrote it before this encoding
// (hooks.clusterState, encoding/json): a client with three subscriptions,
// one of them shared with key filters.
const legacyJSON = `{"client":{"will":{},"properties":{"sessionExpiryInterval":3600,"receiveMaximum":100,` +
	`"sessionExpiryIntervalFlag":true},"username":"dQ==","id":"dev-1","t":"CL","remote":"127.0.0.1:5555",` +
	`"listener":"t1","protocolVersion":5,"clean":false},"subs":[{"t":"SUB","id":"$share/g/k","client":"dev-1",` +
	`"filter":"$share/g/k","qos":1,"since":0},{"t":"SUB","id":"a/#","client":"dev-1","filter":"a/#",` +
	`"identifier":7,"qos":1,"no_local":true,"since":42},{"t":"SUB","id":"b/+","client":"dev-1","filter":"b/+",` +
	`"retain_handling":1,"qos":2,"retain_as_pub":true,"since":9}],"kf":{"$share/g/k":["k1","k/+"]}}`

func legacyState() *State {
	id := "dev-1"
	sub := func(filter string) storage.Subscription {
		return storage.Subscription{ID: filter, T: storage.SubscriptionKey, Client: id, Filter: filter}
	}
	st := &State{
		Client: storage.Client{ID: id, T: storage.ClientKey, Remote: "127.0.0.1:5555", Listener: "t1", Username: []byte("u"),
			ProtocolVersion: 5, Properties: storage.ClientProperties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true, ReceiveMaximum: 100}},
		Subs:       []Sub{{Subscription: sub("$share/g/k")}, {Subscription: sub("a/#"), Since: 42}, {Subscription: sub("b/+"), Since: 9}},
		KeyFilters: map[string][]string{"$share/g/k": {"k1", "k/+"}},
	}
	st.Subs[0].Qos = 1
	st.Subs[1].Qos, st.Subs[1].Identifier, st.Subs[1].NoLocal = 1, 7, true
	st.Subs[2].Qos, st.Subs[2].RetainHandling, st.Subs[2].RetainAsPublished = 2, 1, true
	return st
}

// TestDecodeCluster: a cluster record's state decodes from this encoding and
// from the JSON older nodes wrote, to the same state; damaged JSON is
// ErrCorrupt.
func TestDecodeCluster(t *testing.T) {
	want := legacyState()
	bin := Encode(nil, want)
	t.Logf("state of a client with 3 subscriptions: %d bytes binary, %d bytes JSON", len(bin), len(legacyJSON))
	for name, b := range map[string][]byte{"binary": bin, "JSON": []byte(legacyJSON)} {
		got, err := DecodeCluster("dev-1", b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: decoded\n%+v\nwant\n%+v", name, got, want)
		}
	}
	// A will, as the cluster hook kept it while it could still be sent.
	will, err := DecodeCluster("w", []byte(`{"client":{"protocolVersion":5},"will":{"topic":"lwt","payload":"Ynll","qos":1,"retain":true,`+
		`"user":[{"k":"a","v":"b"}],"delay":30,"run":"r1"}}`))
	if err != nil || will.WillRun != "r1" || !reflect.DeepEqual(will.Client.Will, storage.ClientWill{TopicName: "lwt", Payload: []byte("bye"),
		Qos: 1, Retain: true, User: []packets.UserProperty{{Key: "a", Val: "b"}}, WillDelayInterval: 30, Flag: 1}) {
		t.Fatalf("a JSON will: %+v %v", will, err)
	}
	for _, b := range []string{"{", `{"subs":3}`, legacyJSON[:len(legacyJSON)-1]} {
		if _, err := DecodeCluster("dev-1", []byte(b)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%q: %v, want ErrCorrupt", b, err)
		}
	}
	if _, err := DecodeCluster("dev-1", nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("an empty state: %v, want ErrCorrupt", err)
	}
}
