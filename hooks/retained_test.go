package hooks_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/hooks/retainedtest"
	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/persistence"
)

// TestRetainedStoreBolt runs the retained store's contract suite against
// one node's data file, closed and opened again as a restart does.
func TestRetainedStoreBolt(t *testing.T) {
	retainedtest.Run(t, func(t *testing.T) retainedtest.Deployment {
		dir := t.TempDir()
		var db *persistence.DB
		return retainedtest.Deployment{
			Nodes: 1,
			Open: func(t *testing.T, apply func(packets.Packet)) hooks.RetainedStore {
				var err error
				if db, err = persistence.Open(dir, persistence.Options{NoSync: true}); err != nil {
					t.Fatal(err)
				}
				opened := db
				t.Cleanup(func() { _ = opened.Close() })
				sessions, err := db.OpenSessions()
				if err != nil {
					t.Fatal(err)
				}
				s, err := hooks.NewBoltRetained(sessions, apply)
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
			Close: func(t *testing.T, _ hooks.RetainedStore) {
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}

// TestRetainedStoreCluster runs the retained store's contract suite
// against KL_RETAINED on a fresh 3-server NATS cluster per subtest, each
// store a node of its own on the next server.
func TestRetainedStoreCluster(t *testing.T) {
	retainedtest.Run(t, func(t *testing.T) retainedtest.Deployment {
		urls := natstest.Start(t, 3).URLs()
		nodes := 0
		return retainedtest.Deployment{
			Nodes: 3,
			Open: func(t *testing.T, apply func(packets.Packet)) hooks.RetainedStore {
				s := hooks.NewClusterRetained(apply)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				i := nodes % len(urls)
				nodes++
				n, err := cluster.Start(ctx, cluster.Config{
					URLs: urls[i : i+1], NodeID: fmt.Sprintf("node-%d", nodes),
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				}, cluster.Handler{Retained: s.Deliver})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(n.Close)
				s.SetNode(n)
				return s
			},
		}
	})
}
