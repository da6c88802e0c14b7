package cluster

import (
	"testing"

	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/sessionstore"
	"github.com/keyline-mq/keyline/sessionstore/storetest"
)

// TestSessionStore runs the contract suite of sessionstore.Store (the one
// the in-memory store runs) against the nodes' session bucket: for each
// subtest a fresh 3-server NATS cluster (replicas 3) and two nodes on
// different servers, so that a write through one is read through the other.
func TestSessionStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) []sessionstore.Store {
		nc := natstest.Start(t, 3)
		urls := nc.URLs()
		a, _ := startNodeCfg(t, Config{URLs: urls[:1], NodeID: "node-a", Replicas: 3})
		b, _ := startNodeCfg(t, Config{URLs: urls[1:2], NodeID: "node-b", Replicas: 3})
		return []sessionstore.Store{a.SessionStore(), b.SessionStore()}
	})
}
