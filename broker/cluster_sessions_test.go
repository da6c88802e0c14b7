package broker

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// TestClusterSessionUnreadableRecord: a session record in KL_SESSIONS that
// cannot be decoded costs only its own session. The cluster client list
// still answers, with the other sessions, and the client connects: a new
// session replaces the record (it failed every connect before).
func TestClusterSessionUnreadableRecord(t *testing.T) {
	nc := natstest.Start(t, 1)
	a := startClusterBrokers(t, 1, nc.URLs())[0]
	ctx := context.Background()
	store := a.ClusterNode().SessionStore()
	if _, err := store.Save(ctx, &sessionstore.Record{ClientID: "other", Owner: "node-a", Persistent: true}, 0); err != nil {
		t.Fatal(err)
	}
	kv, err := jsClient(t, nc.URLs()[0]).KeyValue(ctx, cluster.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	// The bucket's key of a client id: "c." and the id's hash (the one node ids use).
	if _, err := kv.Put(ctx, "c."+cluster.NodeHash("dev-1"), []byte{0x01, 0x00, 0xf0}); err != nil {
		t.Fatal(err)
	}

	res, err := http.Get("http://" + a.Addr("http") + adminapi.PathClusterClients)
	if err != nil {
		t.Fatal(err)
	}
	var list adminapi.ClusterClientList
	err = json.NewDecoder(res.Body).Decode(&list)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK ||
		!slices.Equal(list.Clients, []adminapi.ClusterClientView{{ID: "other", Node: "node-a", Persistent: true}}) {
		t.Fatalf("cluster clients: %d %+v %v, want other alone", res.StatusCode, list, err)
	}

	dev := connectPersistent(t, a, "dev-1", false)
	if dev.Connack.SessionPresent {
		t.Fatal("a session present from a record that cannot be decoded")
	}
	rec, _, err := store.Load(ctx, "dev-1")
	if err != nil || rec == nil || rec.Owner != "node-a" || !rec.Connected {
		t.Fatalf("dev-1's record after its connect: %+v %v", rec, err)
	}
}

// oldJSONState is a session state as the releases before the session state
// codec wrote it in KL_SESSIONS (hooks' clusterState, encoding/json): a
// plain subscription and a shared one with key filters.
const oldJSONState = `{"client":{"will":{},"properties":{"sessionExpiryInterval":300,"sessionExpiryIntervalFlag":true},` +
	`"username":null,"id":"w1","t":"CL","remote":"127.0.0.1:5555","listener":"t1","protocolVersion":5,"clean":false},` +
	`"subs":[{"t":"SUB","id":"$share/kf/jobs/#","client":"w1","filter":"$share/kf/jobs/#","qos":1,"since":0},` +
	`{"t":"SUB","id":"plain/#","client":"w1","filter":"plain/#","qos":1,"since":0}],"kf":{"$share/kf/jobs/#":["a*"]}}`

// TestClusterSessionFromOldJSONState: a session record an older node left,
// its state in JSON, resumes with its subscriptions and key filters; the
// record this node writes next holds the binary state, which resumes the
// same on another node.
func TestClusterSessionFromOldJSONState(t *testing.T) {
	nc := natstest.Start(t, 1)
	bs := startClusterBrokers(t, 2, nc.URLs())
	a, b := bs[0], bs[1]
	ctx := context.Background()
	store := a.ClusterNode().SessionStore()
	old := &sessionstore.Record{ClientID: "w1", Owner: "node-old", Persistent: true, DisconnectedAt: time.Now().Unix(), State: []byte(oldJSONState)}
	if _, err := store.Save(ctx, old, 0); err != nil {
		t.Fatal(err)
	}
	opts := mqtttest.WorkerOptions{SessionExpiry: 300, KeepAlive: 30}
	resume := func(node *Broker) *mqtttest.Worker {
		t.Helper()
		w, err := mqtttest.DialWorker(node.Addr("tcp"), "w1", opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		if !w.Connack().SessionPresent {
			t.Fatalf("session not present on %s", node.ClusterNode().NodeID())
		}
		// Its shared subscription rejoined the group with its key filters.
		waitFor(t, 15*time.Second, "w1 a member with key filters a*", func() bool {
			code, body := apiCall(t, "GET", "http://"+node.Addr("http")+adminapi.PathGroupDetail+"?group=kf%2Fjobs%2F%23", "")
			var v adminapi.GroupView
			if code != http.StatusOK || json.Unmarshal(body, &v) != nil {
				return false
			}
			return slices.ContainsFunc(v.PerMember, func(m adminapi.MemberView) bool {
				return m.ID == "w1" && m.Active && slices.Equal(m.KeyFilters, []string{"a*"})
			})
		})
		// Its plain subscription takes messages.
		pub := dialV5(t, node, &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
		pub.Publish(t, &paho.Publish{Topic: "plain/x", QoS: 1, Payload: []byte("plain")})
		if m := w.Next(mqtttest.Timeout); m == nil || m.Topic != "plain/x" {
			t.Fatalf("w1 got %+v, want plain/x", m)
		} else {
			_ = w.Ack(m)
		}
		pub.Close()
		return w
	}
	w1 := resume(a)

	// A change of the session rewrites its state, in the binary codec, with
	// what came from the JSON.
	if rc, err := w1.Subscribe("sync/w1", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	rec, _, err := store.Load(ctx, "w1")
	if err != nil || rec == nil || len(rec.State) == 0 || rec.State[0] == '{' {
		var state []byte
		if rec != nil {
			state = rec.State
		}
		t.Fatalf("w1's record after a subscribe: %v, state %.32q, want a binary state", err, state)
	}
	st, err := sessionstate.DecodeCluster("w1", rec.State)
	if err != nil {
		t.Fatal(err)
	}
	var filters []string
	for _, s := range st.Subs {
		filters = append(filters, s.Filter)
	}
	if !slices.Equal(filters, []string{"$share/kf/jobs/#", "plain/#", "sync/w1"}) ||
		!slices.Equal(st.KeyFilters["$share/kf/jobs/#"], []string{"a*"}) || len(st.KeyFilters) != 1 {
		t.Fatalf("w1's state: subscriptions %q, key filters %v", filters, st.KeyFilters)
	}
	_ = w1.Disconnect()
	resume(b)
}
