package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/sessionstore"
)

// TestCloseAnswersReleaseInProgress: a release request a node is handling
// when it closes is finished before the connection goes: the session's
// record is written and the requesting node gets its answer. (Closed under
// it, a stopping node's write failed with "nats: connection closed" and the
// requester waited RequestTimeout, in TestClusterRollingRestart.)
func TestCloseAnswersReleaseInProgress(t *testing.T) {
	nc := natstest.Start(t, 1)
	urls := nc.URLs()
	entered, goOn := make(chan struct{}), make(chan struct{})
	saved := make(chan error, 1)
	store := make(chan sessionstore.Store, 1) // node a's, once it runs
	a := startNodeWith(t, Config{URLs: urls, NodeID: "node-a"}, Handler{
		Release: func(id string, _ uint64) {
			close(entered)
			<-goOn
			_, err := (<-store).Save(context.Background(), &sessionstore.Record{ClientID: id, Owner: "node-a", Persistent: true}, 0)
			saved <- err
		},
	})
	store <- a.SessionStore()
	b, _ := startNodeCfg(t, Config{URLs: urls, NodeID: "node-b", RequestTimeout: 20 * time.Second})

	requested := make(chan error, 1)
	go func() { requested <- b.RequestRelease(context.Background(), "node-a", "dev-1", 0) }()
	select {
	case <-entered:
	case <-time.After(mqtttest.Timeout):
		t.Fatal("node a got no release request")
	}
	closed := make(chan struct{})
	go func() {
		a.Close()
		close(closed)
	}()
	// Close has begun once it stopped taking requests (or, before, closed
	// the connection outright).
	eventually(t, 10*time.Second, "node a to stop taking requests", func() bool {
		return a.nc.IsClosed() || a.subs[0].IsDraining()
	})
	close(goOn)
	if err := <-saved; err != nil {
		t.Errorf("the release's record write: %v", err)
	}
	select {
	case err := <-requested:
		if err != nil {
			t.Errorf("release request: %v", err)
		}
	case <-time.After(mqtttest.Timeout):
		t.Error("node b got no answer to its release request")
	}
	<-closed
}
