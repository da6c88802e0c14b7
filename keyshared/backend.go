package keyshared

import (
	"context"
	"time"
)

// Backend is where a broker's Key-Shared groups live: each group's log,
// the state of its dispatch (cursor, resolutions above it), its dead
// letters, and where its one dispatcher runs. The broker's hook drives
// groups only through a Backend and never asks which one it has:
//
//   - on one node, NewLocalBackend over a GroupStore (package persistence:
//     the segment log and bbolt, or memory): every group's dispatcher runs
//     here;
//   - in a cluster, package cluster (JetStream): a group's dispatcher runs
//     on the node holding its lease, and every node's Group delivers to the
//     members connected to it.
//
// The contract, which keyshared/backendtest checks against every
// implementation:
//
//   - Groups are named "<share name>/<filter>" (ErrBadGroupName otherwise)
//     and exist from EnsureGroup until DeleteGroup or SweepIdle; operations
//     on a group that does not exist fail with ErrGroupNotFound, and after
//     Close with ErrStoreClosed. EnsureGroup of an existing group changes
//     its config only when it differs.
//   - AppendMultiAsync appends a message to each group and calls done once,
//     on a goroutine of the backend, never inside the call (except after
//     Close), with one result per group in the order given: an offset once
//     the append is durable (offsets start at 1 and only grow; they are
//     never reused), or an error (ErrBacklogFull at a limit under the
//     reject policy or for a message above MaxBytes, ErrGroupNotFound).
//     A group that refuses does not stop the others. Appends of one routing
//     key to one group complete in the order they were made; others may
//     complete in any order, and concurrently.
//   - The backlog rule is GroupConfig.Limits: the reject policy refuses an
//     append past a limit, drop-oldest resolves the oldest unresolved
//     messages (counted in GroupInfo.Dropped).
//   - A Group opened with Open delivers the group's messages to the members
//     added to it through out: per routing key one message in flight, in log
//     order, including after retries, member changes and a restart of the
//     backend or a move of the dispatcher; an ack resolves the message, a
//     nack retries it, a reject dead-letters it (Backend.DeadLetters lists
//     it, ReplayDeadLetter puts it back at the tail, in one step). What is
//     acknowledged stays resolved; what was in flight when a dispatcher
//     stopped is delivered again (at least once).
//   - Pending lists the unresolved messages after the cursor for operators.
//   - SweepIdle deletes the groups without members (anywhere) for ttl that
//     hold no unresolved message and no dead letter, but never an internal
//     group (share.InternalPrefix: the broker's own, whose life the
//     broker's configuration decides).
//
// All methods are safe for concurrent use.
type Backend interface {
	// EnsureGroup creates the group if it does not exist, else updates its
	// config if it differs; created reports which.
	EnsureGroup(name string, cfg GroupConfig) (created bool, err error)
	// DeleteGroup deletes the group with its log, state and dead letters.
	DeleteGroup(name string) error
	// Group returns the group's figures.
	Group(name string) (GroupInfo, error)
	// Groups returns every group's figures, sorted by name.
	Groups() ([]GroupInfo, error)
	// AppendMultiAsync appends m (its Offset is ignored) to each of groups;
	// done owns the slice it gets.
	AppendMultiAsync(groups []string, m Message, done func([]AppendResult))
	// Pending returns up to limit unresolved messages of the group with an
	// offset >= from, in offset order.
	Pending(name string, from uint64, limit int) ([]Message, error)

	// DeadLetters returns up to limit dead letters of the group with an id
	// greater than after, in id order (ids only grow).
	DeadLetters(group string, after uint64, limit int) ([]DeadLetterEntry, error)
	// DeadLetter returns one dead letter.
	DeadLetter(group string, id uint64) (DeadLetterEntry, error)
	// DeleteDeadLetter deletes one dead letter.
	DeleteDeadLetter(group string, id uint64) error
	// ReplayDeadLetter appends the dead letter's message at the log's tail
	// and deletes the dead letter, returning the new offset; the backlog
	// limits apply as to any append.
	ReplayDeadLetter(group string, id uint64) (uint64, error)
	// PurgeDeadLetters deletes all of the group's dead letters and returns
	// how many.
	PurgeDeadLetters(group string) (int, error)

	// SweepIdle deletes every group idle for ttl at now (see above) and
	// returns their names.
	SweepIdle(now time.Time, ttl time.Duration) ([]string, error)
	// Flush returns once every append submitted before it has completed.
	Flush() error
	// OnCommitted asks the backend to call fn after the done calls of each
	// set of appends completed together (one commit) have run, on the
	// goroutine that ran them, so that what they deferred (the publishers'
	// acknowledgements) leaves once per commit; a later call replaces fn.
	// It reports whether the backend will: one that completes appends one
	// by one, with no commit to tell the end of (the cluster: JetStream
	// acknowledges each publish on its own), returns false and never calls
	// fn, and the caller must not defer anything to it.
	OnCommitted(fn func()) bool

	// Open returns this node's Group of the existing group name: the
	// group's dispatch, delivering to the members added to it here through
	// out, and handing out the group's dead letters once stored (on the node
	// dispatching the group). cfg configures the group's dispatcher where it
	// runs on this node.
	Open(name string, cfg Config, out Output) (Group, error)
}

// Output is where a group's dispatch reaches the broker on one node:
// deliveries to the members connected here, and the group's dead letters,
// each once it is stored (the broker publishes them live). DeadLettered is
// called on the dispatcher's goroutine and must not block. An Output that
// is also a Flusher may hold the deliveries it is given until Flush: a
// backend calls Flush after each round of its deliveries (a dispatcher's
// round), or after each delivery where it has no rounds to tell.
type Output interface {
	Deliverer
	DeadLettered(d DeadLetter)
}

// Group is one group as a node's broker drives it: its members connected to
// this node, their acknowledgements, QoS 0 routing on the group's ring, and
// what operators see. Ack, Nack, Reject and Route never wait for the
// dispatcher.
type Group interface {
	// AddMember adds a member connected here (an MQTT client id), or
	// updates one, as a re-subscribe does.
	AddMember(id string, o MemberOptions) error
	// RemoveMember removes a member that left: what it held goes back to
	// its keys.
	RemoveMember(id string) error
	// SetActive marks a member disconnected or back (the dispatcher evicts
	// one that stays away).
	SetActive(id string, active bool) error
	// Ack, Nack and Reject report a member's answer to a delivery of offset.
	Ack(member string, offset uint64) error
	Nack(member string, offset uint64, reason byte) error
	Reject(member string, offset uint64, reason byte) error
	// Notify says the log has new messages (appends made through this
	// node's Backend).
	Notify()
	// Route routes a QoS 0 message on the group's ring to the one member
	// owning its key; it reports the member and whether it took it (false:
	// dropped and counted, or sent on to where the ring is).
	Route(m *Message) (member string, taken bool)
	// Stats returns the dispatcher's figures, RouterStats the ring's.
	Stats() Stats
	RouterStats() RouterStats
	// Members returns every member of the group, sorted by id (in a
	// cluster, those of every node, with their node).
	Members() []MemberInfo
	// Holder returns the node dispatching the group ("" on one node) and
	// whether a dispatcher serves it now.
	Holder() (node string, dispatching bool)
	// HeldHere reports whether the group's dispatcher runs on this node now
	// (in a cluster: by this node's own clock, so that no other node can
	// dispatch it meanwhile, which a read of the lease cannot tell).
	HeldHere() bool
	// States returns where messages stand, as the dispatcher sees them.
	States(ctx context.Context, offsets []uint64) ([]MessageStatus, error)
	// Close ends this node's side of the group (the group lives on).
	Close(ctx context.Context) error
}

// MemberInfo is what a group knows of one member.
type MemberInfo struct {
	ID string `json:"id"`
	// Node is the cluster node the member is connected to ("" on one node).
	Node string `json:"node"`
	// QoS is the QoS granted to the member's subscription.
	QoS byte `json:"qos"`
	// KeyFilters are the member's key-filter patterns; none means every key.
	KeyFilters []string `json:"key_filters,omitempty"`
	// Connected reports whether the member is connected now.
	Connected bool `json:"connected"`
}

// AppendMulti is AppendMultiAsync waited for.
func AppendMulti(b Backend, groups []string, m Message) []AppendResult {
	ch := make(chan []AppendResult, 1)
	b.AppendMultiAsync(groups, m, func(rs []AppendResult) { ch <- rs })
	return <-ch
}
