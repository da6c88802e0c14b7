package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// NodeLocalKeyShared keeps Key-Shared groups per node in cluster mode: a
// group on a node takes the messages published on that node, not the ones
// that arrive from other nodes (those would reach every node's copy of the
// group and be processed once per node). Groups spanning nodes are the next
// step (docs/cluster.md); this wrapper is the seam.
type NodeLocalKeyShared struct {
	*KeyShared
	// FromCluster reports whether a publish was injected by the cluster hook.
	FromCluster func(cl *mqtt.Client) bool
}

// OnPublish skips publishes that came from another node.
func (h NodeLocalKeyShared) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.FromCluster != nil && h.FromCluster(cl) {
		return pk, nil
	}
	return h.KeyShared.OnPublish(cl, pk)
}
