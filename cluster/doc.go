// Package cluster joins Keyline nodes into one MQTT namespace over NATS and
// JetStream. It knows NATS, not mochi: the broker's hooks hand it opaque
// message bodies and session records and take them back.
//
// # What travels where
//
//   - QoS 0 messages go over core NATS on kl.m.<topic subject>. Each node
//     subscribes to the subjects its local subscriptions' filters map to
//     (FilterSubjects), all in one queue group named after the node, so NATS
//     hands a node one copy of a message however many of its subscriptions
//     match, and none to a node without interest. The publishing node's
//     connection has no echo: it delivers locally itself.
//   - QoS 1 and 2 messages are stored once in the stream KL_MSGS (subjects
//     kl.q.>) before the publisher is acknowledged, then read by one ordered
//     consumer per node (ephemeral, one replica, in memory, no acks; nats.go
//     recreates it from the last sequence it delivered after a gap or a
//     reconnect) whose filter subjects are the node's interest. An interest
//     change replaces it with one that starts after the last message the
//     node handled. Never one consumer per MQTT subscription: that is what
//     makes nats-server's own MQTT support collapse under thousands of Raft
//     groups.
//   - Retained messages live in the stream KL_RETAINED (kl.r.>, one message
//     per subject); every node tails it into its local retained index.
//   - Session records live in the KV bucket KL_SESSIONS, keyed by a hash of
//     the client id (never the raw id), written with compare-and-set on the
//     key's revision, in internal/sessionrec's codec with the id in the
//     record (JSON records of earlier releases still read).
//
// # Invariants
//
//  1. Every subject Keyline uses starts with "kl." and is a valid NATS
//     subject no longer than MaxSubjectLen (fuzzed in subject_test.go).
//  2. A node's consumer filter set has no subject that is a subset of
//     another (JetStream refuses overlapping filters) and covers every
//     subject in the node's interest; AddInterest returns only once a
//     consumer with the new filter exists.
//  3. Messages reach Handler.Message in stream order per path: core messages
//     in the order the node's connection received them, queued messages in
//     KL_MSGS sequence order (one goroutine each).
//  4. A session record is only ever written with the revision the writer
//     last read or wrote; a writer whose write is refused has lost the
//     session and must drop it.
//  5. A session's Floor only grows while one owner holds it, and everything
//     in KL_MSGS above it that matches the session's subscriptions is
//     delivered again by the next owner (Replay): losing a record update
//     costs duplicates, never messages.
//
// # Caveats
//
//   - Core NATS is at most once: a QoS 0 message in flight while a node
//     reconnects to NATS is lost, as MQTT allows.
//   - A node's own QoS 1/2 publishes come back to it through its consumer
//     when it has local interest in them; it skips them by the Kl-Node header.
package cluster
