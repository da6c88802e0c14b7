package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
)

// ClusterKeyShared is the Key-Shared hook in cluster mode, where a group is
// one group across all nodes (KeySharedConfig.Cluster): the node a publish
// arrives on appends it to the group's log, so the copies the cluster hook
// injects from other nodes are not taken again.
type ClusterKeyShared struct {
	*KeyShared
	// FromCluster reports whether a publish was injected by the cluster hook.
	FromCluster func(cl *mqtt.Client) bool
}

// OnPublish skips publishes that came from another node.
func (h ClusterKeyShared) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.FromCluster != nil && h.FromCluster(cl) {
		return pk, nil
	}
	return h.KeyShared.OnPublish(cl, pk)
}

// IsOpen reports whether this node has its side of group name open: its
// publishes matching the group's filter go to the group.
func (h *KeyShared) IsOpen(name string) bool { return h.groups.get(name) != nil }

// OpenGroup opens this node's side of a group another node created, so
// that publishes here reach its log.
func (h *KeyShared) OpenGroup(name string) error {
	n, err := share.Parse(name)
	if err != nil {
		return err
	}
	_, err = h.openGroup(n, false)
	return err
}

// PublishDeadLetter publishes a dead letter of group live on $dlq/... (the
// cluster's holder of the group calls it once the dead letter is stored).
func (h *KeyShared) PublishDeadLetter(group string, d keyshared.DeadLetter) {
	n, err := share.Parse(group)
	if err != nil {
		return
	}
	h.dlq.publish(group, n.Share, d)
}
