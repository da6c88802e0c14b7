package hooks

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
)

// ClusterRetained is the retained store of a cluster: the stream
// KL_RETAINED (one message per topic), which every node follows into its
// local index, its own changes included, in stream order. Expiry needs no
// write: a message's expiry travels with it, and a node opening later
// skips what has expired.
type ClusterRetained struct {
	apply func(packets.Packet)
	node  atomic.Pointer[cluster.Node]
	// Dropped counts malformed messages of the stream.
	Dropped atomic.Uint64
}

// NewClusterRetained returns the cluster's retained store, applying through
// apply. Its Deliver is the node's Handler.Retained; bind it to the node
// with SetNode once the node has started (Start applies the stream's
// retained messages before it returns: the opening of the contract).
func NewClusterRetained(apply func(packets.Packet)) *ClusterRetained {
	return &ClusterRetained{apply: apply}
}

// SetNode binds the store to its node.
func (s *ClusterRetained) SetNode(n *cluster.Node) { s.node.Store(n) }

// Deliver applies one message of the retained stream (the node's
// Handler.Retained: one goroutine, in stream order).
func (s *ClusterRetained) Deliver(in cluster.Incoming) {
	pk, err := decodeEnvelope(in.Data)
	if err != nil {
		s.Dropped.Add(1)
		return
	}
	if pk.Expiry > 0 && pk.Expiry < time.Now().Unix() {
		pk.Payload = nil // expired while stored: a deletion
	}
	s.apply(pk)
}

// Retain stores pk in KL_RETAINED and returns once JetStream has it.
func (s *ClusterRetained) Retain(ctx context.Context, pk packets.Packet) error {
	n := s.node.Load()
	if n == nil {
		return cluster.ErrNotReady
	}
	body, err := encodeEnvelope(pk)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cluster.DefaultPublishTimeout+time.Second)
	defer cancel()
	return n.StoreRetained(ctx, pk.TopicName, body)
}

// CatchUp waits until the node has applied every retained message stored
// before the call.
func (s *ClusterRetained) CatchUp(ctx context.Context) error {
	n := s.node.Load()
	if n == nil {
		return cluster.ErrNotReady
	}
	return n.CatchUpRetained(ctx)
}

// Expired needs nothing: the stream's copy carries its expiry.
func (*ClusterRetained) Expired(string) {}
