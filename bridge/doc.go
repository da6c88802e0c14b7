// Package bridge connects a Keyline broker to other MQTT brokers, as
// mosquitto's bridges do: each bridge is one MQTT client connection to a
// remote broker (3.1.1 or 5, TLS with a client certificate, addresses tried
// in order) and topic rules in mosquitto's `topic` terms that say what
// crosses it, out (local to remote), in (remote to local) or both.
//
// # Basics
//
// Outbound, a rule is an internal Key-Shared group on the rule's local
// filter (share name "$keyline.bridge.<bridge>", which no client can take,
// list or see) whose one member is the bridge's connection. So what the
// broker does for `$share` groups it does for a bridge: a QoS 1/2 publish is
// in the group's durable log before its publisher is acknowledged; the
// backlog is bounded in messages and bytes with a policy (drop-oldest by
// default, or reject), counted; the remote's PUBACK/PUBCOMP is the member's
// ack and resolves the message; a refusal is a nack (retried with backoff)
// or, for a reason code that cannot change, a dead letter; a lost connection
// requeues what was in flight at the head of its keys. An `ordered` rule
// keeps one message per routing key in flight (the key user property, else
// the topic), so a key's order holds across retries, reconnections and
// restarts; otherwise the group is unordered (keyshared.Config.Unordered)
// and up to the remote's Receive Maximum are in flight, sent in log order.
// In cluster mode the group has one dispatcher in the cluster under a lease,
// and the bridge connects only on the node that holds its first group's
// lease (a bridge without outbound rules has an anchor group for that), so
// one node runs it at a time and it moves when that node goes.
//
// Inbound, the bridge subscribes on the remote (MQTT 5: No Local, Retain As
// Published) and publishes what comes through an Injector, the broker's own
// client: a QoS 1/2 message is in the logs of the groups it matches before
// the remote is acknowledged. A message brought in never goes back out
// through the same bridge.
//
// The remote connection is a small MQTT client of this package over
// internal/mqttwire (see the commit that added it for why not paho): one
// reader and one writer goroutine, a window of packet ids, keep-alive.
//
// # Invariants
//
//  1. A QoS 1/2 message matched by an outbound rule is acknowledged to its
//     publisher only once it is in the rule's group log (the Key-Shared
//     durability point), and resolved there only once the remote
//     acknowledged it, the rule forwards at QoS 0 and it was written, or it
//     was dead-lettered or dropped by the backlog policy (counted).
//  2. At most one connection per bridge per node, and in cluster mode the
//     bridge is connected only while its node holds the anchor group's lease
//     by its own clock (as the group's dispatcher runs), never on the word
//     of a read of the lease, which may be stale.
//  3. A message from the remote is acknowledged only after the injector
//     published it; a refusal that may pass later is never acknowledged
//     (the bridge disconnects and the remote sends it again).
//  4. A message is never sent out of a broker it left before, nor taken
//     into one it left or entered before (the keyline-via and keyline-in
//     user properties, MQTT 5 only).
//
// # Caveats
//
//   - Delivery across a bridge is at least once: what was in flight when a
//     connection or the broker went is sent again, so the remote may see a
//     message twice (QoS 2 included).
//   - The group log keeps no retain flag: outbound messages arrive at the
//     remote without it.
//   - Unordered rules keep the log order on one connection and from one
//     connection to the next (what was in flight goes out again before what
//     waited for room); a retry after a nack goes out after messages read
//     later.
//   - MQTT 3.1.1 has no user properties and no No Local: a 3.1.1 remote that
//     does not honour try_private (mosquitto and keyline do) sends the
//     bridge's own messages back
//     (published here once more, never sent out again), and two bridges
//     between the same brokers over 3.1.1 that forward the same topics both
//     ways loop, as they do in mosquitto.
//   - In cluster mode a bridge's other rules' groups may have their
//     dispatchers on other nodes: their messages reach the bridge's node
//     over NATS like any remote member's.
//   - Inbound messages to ordinary subscribers are as durable as the
//     broker's own publishes; only group logs are written before the
//     remote's acknowledgement.
package bridge
