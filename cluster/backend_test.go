package cluster

import (
	"testing"

	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/keyshared/backendtest"
)

// TestBackend runs the contract suite of keyshared.Backend (the one the
// local backend runs in package persistence) against the cluster's groups:
// for each subtest a fresh 3-server NATS cluster and two nodes, of which
// the suite drives the first; a group's dispatcher runs on whichever node
// holds its lease, so deliveries may cross nodes.
func TestBackend(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) []keyshared.Backend {
		nc := natstest.Start(t, 3)
		urls := nc.URLs()
		_, a := startGroupsNode(t, urls[:1], "node-a")
		_, b := startGroupsNode(t, urls[1:2], "node-b")
		return []keyshared.Backend{a, b}
	})
}
