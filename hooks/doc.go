// Package hooks holds Keyline's thin mochi glue, one hook per concern. The
// broker adds them in this order, from the table in broker/hooks.go that
// gives each its reason (a hook that ends a chain, as the fan-out's
// OnPublish does with CodeSuccessIgnore, must come after those that still
// need the packet):
//   - Auth (auth.go, acl.go): authentication, a deterministic ACL (ACL, also
//     the read check of the fan-out and Key-Shared), reserved topics, client
//     id ownership;
//   - BridgeMark (bridgemark.go): No Local on a bridge's subscriptions;
//   - Storage (storage.go; single node): persistent sessions and $SYS
//     figures in the data file;
//   - Retained (retained*.go; both modes): retained messages through one
//     RetainedStore, the data file's on one node, KL_RETAINED in a cluster
//     (contract suite: retainedtest);
//   - KeyShared (keyshared.go, ks_*.go; ClusterKeyShared in cluster mode):
//     Key-Shared dispatch of $share groups over the durable group logs
//     (ks_publish.go appends, ks_deliver.go delivers, ks_dlq.go publishes
//     dead letters live);
//   - Cluster (cluster*.go; cluster mode): publishes, wills and sessions
//     across nodes on NATS JetStream (session records through
//     sessionstore.Store), done by parts that each own one kind of state
//     (the table at the top of cluster.go);
//   - Protocol (protocol.go): CONNACK, SUBACK, UNSUBACK and PUBLISH as MQTT
//     wants them where mochi writes them otherwise; max keep alive;
//   - Fanout (fanout*.go, outbox_store.go): deliveries to ordinary
//     subscribers encoded once and queued by reference on each connection,
//     QoS 1/2 through each session's outbox;
//   - PacketReader (packet_read.go): the one hook reading packets as they
//     arrive, calling the ReadPacket steps of Auth, KeyShared and Fanout in
//     order (mochi copies a packet into every OnPacketRead hook);
//   - PacketEncoder (packet_encode.go): the one hook correcting packets
//     mochi writes, calling the EncodePacket steps of Auth, Retained,
//     Cluster, Protocol and Fanout in order (mochi copies a packet into
//     every OnPacketEncode hook);
//   - Observe (observe.go): publishes as routed, while the console watches.
//
// encode.go holds the encoders of the frames the hooks queue themselves,
// topiccache.go the bounded topic cache under the fan-out's routes and the
// groups' topic index, refuse.go the refusal of a granted subscription.
// Logic that is not about mochi lives in keyshared/, persistence/, cluster/
// and internal/.
package hooks
