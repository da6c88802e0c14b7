package broker

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/natstest"
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
