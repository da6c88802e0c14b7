package keyshared

import (
	"errors"
	"fmt"
	"time"

	"github.com/keyline-mq/keyline/internal/backlog"
	"github.com/keyline-mq/keyline/internal/enum"
	"github.com/keyline-mq/keyline/internal/share"
)

// The types of Key-Shared groups' storage, shared by every backend: a
// group's settings and figures, append results, dead-letter entries, and
// the errors every backend returns for the same conditions.

// ErrGroupNotFound is returned for an operation on a group that does not exist
// (never created, deleted, or swept for idleness).
var ErrGroupNotFound = errors.New("keyshared: group not found")

// ErrBadGroupName is returned for a group name that is not a valid
// "<share name>/<filter>" (see package internal/share).
var ErrBadGroupName = errors.New("keyshared: invalid group name")

// ErrBadConfig is returned by EnsureGroup for a GroupConfig that does not validate.
var ErrBadConfig = errors.New("keyshared: invalid group config")

// ErrBacklogFull is returned by an append to a group whose backlog limit is
// reached under the reject policy, or for a message larger than the group's
// byte limit under any policy. The broker answers it with MQTT 5 reason code
// 0x97 (quota exceeded).
var ErrBacklogFull = errors.New("keyshared: group backlog full")

// ErrDeadLetterNotFound is returned for a dead letter id the group does not hold.
var ErrDeadLetterNotFound = errors.New("keyshared: dead letter not found")

// ErrStoreClosed is returned by every operation on a group store or
// backend after Close.
var ErrStoreClosed = errors.New("keyshared: group store closed")

// MaxGroupNameLen is the longest group name a store accepts, in bytes (the
// largest bbolt key).
const MaxGroupNameLen = share.MaxNameLen

// BacklogPolicy says what an append does when a group's backlog limit is
// reached. The zero value means "not set", which acts as PolicyReject.
type BacklogPolicy uint8

const (
	// PolicyReject fails the append with ErrBacklogFull (the default).
	PolicyReject BacklogPolicy = iota + 1
	// PolicyDropOldest drops the oldest unresolved entries to make room; they
	// are counted in GroupInfo.Dropped.
	PolicyDropOldest
)

// BacklogPolicies names the policies, in value order.
var BacklogPolicies = enum.Names{"reject", "drop-oldest"}

// String returns the policy's configuration name ("" when not set).
func (p BacklogPolicy) String() string { return BacklogPolicies.Name(uint8(p)) }

// ParseBacklogPolicy parses "reject" or "drop-oldest".
func ParseBacklogPolicy(s string) (BacklogPolicy, error) {
	v, err := BacklogPolicies.Parse("backlog-policy", s, ErrBadConfig)
	return BacklogPolicy(v), err
}

// UnmarshalText parses the policy from YAML, JSON and other text formats.
func (p *BacklogPolicy) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*p = 0
		return nil
	}
	v, err := ParseBacklogPolicy(string(b))
	if err == nil {
		*p = v
	}
	return err
}

// MarshalText prints the policy's name.
func (p BacklogPolicy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// Set makes *BacklogPolicy a flag value (pflag.Value).
func (p *BacklogPolicy) Set(s string) error { return p.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (p *BacklogPolicy) Type() string { return "policy" }

// GroupConfig holds the settings of one group. The zero value means no limits.
type GroupConfig struct {
	// MaxMessages bounds the messages after the cursor; 0 means no bound.
	MaxMessages uint64 `json:"max_messages,omitempty"`
	// MaxBytes bounds the encoded size (topic, key, properties and payload) of the
	// messages after the cursor; 0 means no bound.
	MaxBytes uint64 `json:"max_bytes,omitempty"`
	// Policy applies when a limit is reached; zero means PolicyReject.
	Policy BacklogPolicy `json:"policy,omitempty"`
}

// Validate reports whether c is usable.
func (c GroupConfig) Validate() error {
	if c.Policy > PolicyDropOldest {
		return fmt.Errorf("%w: backlog policy %d (want %s)", ErrBadConfig, c.Policy, BacklogPolicies)
	}
	return nil
}

// Limits are c's backlog limits, the one admission rule of every backend
// (package internal/backlog).
func (c GroupConfig) Limits() backlog.Limits {
	return backlog.Limits{MaxMessages: c.MaxMessages, MaxBytes: c.MaxBytes, DropOldest: c.policy() == PolicyDropOldest}
}

func (c GroupConfig) policy() BacklogPolicy {
	if c.Policy == 0 {
		return PolicyReject
	}
	return c.Policy
}

// GroupInfo describes one group and its figures at one moment.
type GroupInfo struct {
	// Name is "<share name>/<filter>".
	Name    string
	Share   string
	Filter  string
	Created time.Time
	Config  GroupConfig
	// Head is the offset of the last appended message; 0 if none ever was.
	Head uint64
	// Cursor is the persisted cursor: every offset <= Cursor is resolved.
	Cursor uint64
	// Backlog counts the messages after the cursor that the log still holds.
	Backlog uint64
	// StoredMessages and StoredBytes count what the log holds, including
	// resolved entries that background trimming has not removed yet.
	StoredMessages uint64
	StoredBytes    uint64
	// Dropped counts unresolved messages dropped by the drop-oldest policy (persisted).
	Dropped uint64
	// Quarantined counts records of the group's log that could not be
	// decoded: kept raw in the data file and skipped.
	Quarantined uint64
	// Lost counts messages whose records were found damaged in the segment
	// log (at start or while reading): resolved, so that the group goes on.
	Lost uint64
	// Unsynced counts resolutions (acks, dead letters, drops) not yet durable:
	// a crash now would deliver those messages again.
	Unsynced uint64
	// Rejected counts appends refused with ErrBacklogFull since the store was opened.
	Rejected    uint64
	DeadLetters uint64
	// Members is the member count the broker last reported.
	Members int
	// LastSeen is when the group last had members (its creation if it never had
	// any; the time the store was opened if it had members when the broker stopped).
	LastSeen time.Time
}

// AppendResult is the outcome of appending one message to one group.
type AppendResult struct {
	Group  string
	Offset uint64
	Err    error
}

// DeadLetterEntry is a stored dead letter and its id within its group. Ids
// strictly increase within a group and are never reused.
type DeadLetterEntry struct {
	ID uint64
	DeadLetter
}

// GroupStore is the durable storage under the Key-Shared groups of one node
// (single-node mode): each group's log, cursor, resolutions and dead
// letters, on which the node runs the group's dispatcher. The bbolt store
// and the in-memory store of package persistence implement it and pass its
// test suite; NewLocalBackend turns one into this node's Backend. (A
// cluster's groups are a Backend of their own: their logs are in JetStream
// and their dispatchers run on the node holding each group's lease.) All
// methods are safe for concurrent use.
//
// Completion callbacks (AppendAsync, AppendMultiAsync) run on a goroutine of the
// store, one at a time, in the order the appends were submitted, after the
// commit that covers them; never inside the call that submitted them, except
// after Close, when they are called at once with ErrClosed. They should be
// short. They may call the store, blocking methods included, except Flush,
// which waits for the callbacks and would wait for itself.
type GroupStore interface {
	// EnsureGroup creates the group if it does not exist, else updates its
	// config; created reports which.
	EnsureGroup(name string, cfg GroupConfig) (created bool, err error)
	// DeleteGroup deletes the group with its log, cursor and dead letters.
	DeleteGroup(name string) error
	// Group returns the group's figures.
	Group(name string) (GroupInfo, error)
	// Groups returns every group's figures, sorted by name.
	Groups() ([]GroupInfo, error)
	// Log returns the group's log as the dispatcher uses it. The handle stays
	// valid across appends; once the group is deleted its methods fail with
	// ErrGroupNotFound.
	Log(name string) (Log, error)

	// Append appends m (its Offset is ignored) and returns its offset once the
	// commit that holds it is durable per the sync mode.
	Append(group string, m Message) (uint64, error)
	// AppendAsync appends m and calls done once with the outcome.
	AppendAsync(group string, m Message, done func(offset uint64, err error))
	// AppendMulti appends m to each of groups in one commit and returns one
	// result per group, in the order given. A group that refuses (full, unknown)
	// does not stop the others.
	AppendMulti(groups []string, m Message) []AppendResult
	// AppendMultiAsync is the asynchronous AppendMulti; done owns the slice.
	AppendMultiAsync(groups []string, m Message, done func([]AppendResult))
	// OnAppend registers fn to be told, after each commit that adds entries to a
	// group, the group and its new head. It runs like a completion callback, after
	// the callbacks of the same commit. A later call replaces fn; nil removes it.
	OnAppend(fn func(group string, head uint64))
	// OnCommitted registers fn to run after the callbacks of every commit
	// (its done calls and OnAppend) have run, on the goroutine that ran
	// them: what they deferred is done there once per commit. A done call
	// that reports success always runs before one of these. A later call
	// replaces fn; nil removes it.
	OnCommitted(fn func())

	// DeadLetters returns up to limit dead letters of the group with an id
	// greater than after, in id order: pass the last id seen to page on.
	DeadLetters(group string, after uint64, limit int) ([]DeadLetterEntry, error)
	// DeadLetter returns one dead letter.
	DeadLetter(group string, id uint64) (DeadLetterEntry, error)
	// DeleteDeadLetter deletes one dead letter.
	DeleteDeadLetter(group string, id uint64) error
	// ReplayDeadLetter appends the dead letter's message at the log's tail and
	// deletes the dead letter in one commit, returning the new offset. The
	// backlog limits apply as to any append.
	ReplayDeadLetter(group string, id uint64) (uint64, error)
	// PurgeDeadLetters deletes all of the group's dead letters and returns how many.
	PurgeDeadLetters(group string) (int, error)

	// MembersChanged records how many members the group has now. The idle TTL
	// counts from the moment the count drops to zero.
	MembersChanged(group string, members int, now time.Time) error
	// SweepIdle deletes every group that has had no members for ttl or longer
	// at now, holds no unresolved message and no dead letter, and returns
	// their names. A group holding messages is never swept.
	SweepIdle(now time.Time, ttl time.Duration) ([]string, error)

	// Flush returns once every operation submitted before it has committed,
	// their callbacks have run, and trimming below the cursors has caught up.
	Flush() error
}
