package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/sessionstore"
)

// backends is what differs between one node and a cluster node: the
// implementation behind each seam, chosen once by singleBackends or
// (startCluster) the cluster's, in buildHooks' one branch on the mode. The
// rest of the broker reads them without asking which mode it runs in.
//
//	seam                one node                      cluster
//	Key-Shared groups   keyshared.NewLocalBackend     cluster.Groups (JetStream)
//	                    (segment log + bbolt)
//	retained messages   hooks.NewBoltRetained         hooks.ClusterRetained (KL_RETAINED)
//	session outboxes    hooks.NewOutboxStore (bbolt)  the cluster hook's (JetStream sequences)
//	session records     persistence.SessionRecords    cluster.Node.SessionStore (KL_SESSIONS)
//	(sessionstore.Store) (bbolt), read by hooks.Storage  read by hooks.Cluster
//	members' key filters hooks.StoredKeyFilters (bbolt)  hooks.Cluster (the session record)
//	(hooks.KeyFilterStore)
//	cross-node route    none                          hooks.Cluster over cluster.Node
type backends struct {
	groups keyshared.Backend
	outbox outbox.Store
	// sessions keeps one node's session records, for hooks.Storage (nil
	// on a cluster node: hooks.Cluster reads its node's, SetNode).
	sessions sessionstore.Store
	// keyFilters keeps persistent members' key filters, for Key-Shared.
	keyFilters hooks.KeyFilterStore
	// refs is what the fan-out records with each outbox copy of a QoS 1/2
	// message (nil: nothing; a cluster: its JetStream sequence).
	refs func(packets.Packet) uint64
	// ready reports whether the backends let the node serve.
	ready func() bool
	// nodeID is the node's id ("" on one node).
	nodeID string
	// expire forgets a session wherever its record is kept.
	expire func(*mqtt.Client)
	// fromCluster names the inline clients that inject what other nodes
	// sent (nil on one node).
	fromCluster func(*mqtt.Client) bool
	// close ends the backends' own work, after the server has stopped.
	close func()
}

// singleBackends are one node's: everything in the data file.
func (b *Broker) singleBackends() (backends, error) {
	retained, err := hooks.NewBoltRetained(b.sessions, b.retained.Apply)
	if err != nil {
		return backends{}, err
	}
	b.retained.SetStore(retained, nil)
	return backends{
		groups:     keyshared.NewLocalBackend(b.db.Groups()),
		outbox:     hooks.NewOutboxStore(b.sessions),
		sessions:   b.sessions.Records(),
		keyFilters: hooks.StoredKeyFilters{Sessions: b.sessions, Log: b.log},
		ready:      func() bool { return true },
		expire:     func(cl *mqtt.Client) { b.storage.OnClientExpired(cl) }, // made after Key-Shared
		close:      func() {},
	}, nil
}

// clusterBackends are a cluster node's (after startCluster and startGroups).
func (b *Broker) clusterBackends() backends {
	return backends{
		groups:      b.groups,
		outbox:      b.cluster.OutboxStore(),
		keyFilters:  b.cluster,
		refs:        b.cluster.MessageRef,
		ready:       b.cluster.Ready,
		nodeID:      b.node.NodeID(),
		expire:      b.cluster.OnClientExpired,
		fromCluster: b.cluster.FromCluster,
		close: func() {
			_ = b.cluster.Stop() // mochi stops it too once it served
			b.groups.Close()     // hands its leases over, each after a last state write
			b.node.Close()       // after the server: its hooks write session records on the way out
		},
	}
}
