// Package keyshared is Keyline's Key-Shared dispatcher: it decides which
// member of a `$share/<group>/<filter>` group gets which message of the
// group's durable log, and when.
//
// # Basics
//
// Every message carries a routing key. A consistent-hash ring (VirtualNodes
// points per member, FNV-1a with the murmur3 finalizer) maps each key to one
// member; members may narrow the keys they take with glob key filters ('*',
// '?'), and a member that may not read a message's topic, or cannot take the
// message (its Maximum Packet Size), is not eligible for it
// (MemberOptions.CanRead, MemberOptions.Fits). A Dispatcher reads the log from the group's
// cursor into an in-flight window bounded in messages and bytes, delivers
// through a Deliverer, and resolves each message when its member acks it;
// nacks and ack timeouts retry it with exponential backoff, and after
// Config.MaxDeliveries failed attempts the poison policy applies (dead-letter,
// drop or block). Every resolution is handed to the log (Log.Resolve) after
// the batch of work that made it, so acks above the cursor are durable too.
// The package knows neither mochi nor bbolt: it talks to storage through Log,
// to clients through Deliverer, and takes time from a Clock.
//
// # Invariants
//
//  1. At most one message per key per group is in flight.
//  2. A key's messages are delivered in log order, including after retries,
//     member changes and restarts.
//  3. The log is told an offset is resolved (and so its cursor may pass it)
//     only once it is acked, dead-lettered, dropped by policy or expired.
//  4. A key maps to exactly one live member; a membership change remaps about
//     1/N of the keys, and a moved key waits until its in-flight message on
//     the old member resolves.
//
// They follow from one structure: the window keeps each key's unresolved
// messages in a queue in log order, and only the head of a queue is ever
// delivered. A retry, a requeue after the loss of a member and a redelivery
// after a restart all deliver that same head again, so order holds; a key's
// next message is routed (on the current ring) only when its head resolves,
// so a moved key waits for its old member. The cursor is the offset below the
// lowest unresolved message of the window; the log skips what it holds as
// resolved when the dispatcher reads it again after a restart. The tests
// check all four after every step of randomized runs (checkInvariants).
//
// # Outcomes
//
// An ack resolves a message. A nack retries it after backoff; a nack with
// reason 0x87 or 0x99 (NeverRetry), or Reject, dead-letters it at once. Ack
// timeouts and the loss of the member (RemoveMember, or eviction after
// Config.EvictAfter heartbeats inactive) count as failed attempts like nacks,
// so a message that crashes every worker ends in the dead letters; a lost
// member's messages are requeued at the head of their keys, never treated as
// acked. Messages that expired are skipped and counted. A message that no
// member may take (key filters, read access) is never skipped: its key waits
// for a member that may (Stats.UnroutableKeys), and so does the cursor.
// Return hands back a delivery its member turns out not to be able to read
// (a check made where the member is): uncounted, it is routed again.
//
// # Caveats
//
//   - Delivery is at least once. Resolutions the log had not committed when
//     the broker crashed (its last commit interval) are lost and those
//     messages are delivered again; retry counts start over after a restart.
//   - A group without members reads nothing from its log: its backlog stays
//     in the log, not in memory, until a member joins.
//   - The heartbeat runs only while the group has timed work (deliveries
//     awaiting acks, retries, disconnected or paused members), so an idle
//     group costs no wakeups.
//   - A key owned by a disconnected member waits for it until it reconnects
//     or is evicted (3 s by default); the keys of other members go on.
//   - The block poison policy stops its key until a late ack resolves the
//     message. The cursor cannot pass it, so the key's later messages stay in
//     the window and a busy key eventually fills it.
//   - Offsets the log skips (gaps) are passed once a later message is read.
//   - Ack, Nack and Reject queue without bound so that they never wait for
//     the loop; the broker reports only answers to deliveries it made, of
//     which at most Config.Window are outstanding.
//   - A Deliverer is called on the loop goroutine and must not block: one
//     slow Deliver stalls the whole group.
//   - Config.Unordered lifts invariants 1 and 2 for a group: each message is
//     a queue of its own, handed out in log order up to the member's limit,
//     and a retry goes out after messages read later. Invariant 3 holds as
//     ever: the cursor waits for the lowest unresolved message.
//   - Router, the non-reliable (QoS 0) variant, keeps no state per message:
//     what a member refuses is dropped, and a message no member may take is
//     skipped (counted).
package keyshared
