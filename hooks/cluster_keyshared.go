package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
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

// openClusterGroup opens this node's side of a cluster-wide group: its
// dispatcher runs on the node holding the group's lease, which delivers to
// members here through groupOut.
func (h *KeyShared) openClusterGroup(name string, n share.Name) (*ksGroup, error) {
	g := &ksGroup{name: name, n: n}
	grp, err := h.cfg.Cluster.Open(name, &groupOut{h: h, g: g})
	if err != nil {
		return nil, err
	}
	g.d, g.r = grp, clusterRouter{grp}
	return g, nil
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
	_, err = h.ensureGroup(n)
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

// clusterRouter routes QoS 0 messages through the group's holder, whose
// ring has the members of every node (members join it with the dispatcher).
type clusterRouter struct{ g *cluster.Group }

func (clusterRouter) AddMember(string, keyshared.MemberOptions) error { return nil }
func (clusterRouter) RemoveMember(string) error                       { return nil }

func (r clusterRouter) Route(m *keyshared.Message) (string, bool) {
	r.g.Route(m)
	return "", true
}

func (r clusterRouter) Stats() keyshared.RouterStats { return r.g.RouterStats() }
