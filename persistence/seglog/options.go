package seglog

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/keyline-mq/keyline/internal/backlog"
)

// ErrClosed is returned (or passed to callbacks) for operations submitted
// after Close.
var ErrClosed = errors.New("seglog: log closed")

// ErrGroupNotFound is returned for a group the log does not know (never
// added, or dropped).
var ErrGroupNotFound = errors.New("seglog: group not found")

// ErrGroupExists is returned by AddGroup for an id the log knows, or knew:
// ids are never reused, so an id that was dropped, or whose records were found
// in the log without a checkpoint at Open, cannot be added again.
var ErrGroupExists = errors.New("seglog: group id in use")

// ErrBacklogFull is returned for an append that would take a group past
// Limits under the reject policy, and for a message larger than
// Limits.MaxBytes under either policy.
var ErrBacklogFull = errors.New("seglog: group backlog full")

// ErrTooLarge is returned for an append whose record would exceed
// MaxMessageSize.
var ErrTooLarge = errors.New("seglog: message too large")

// ErrReadOnly is returned for a change to a log opened with Options.ReadOnly.
var ErrReadOnly = errors.New("seglog: log opened read-only")

// ErrBadOptions is returned by Open for Options that do not validate.
var ErrBadOptions = errors.New("seglog: invalid options")

// ErrUnusable is returned by Open when the directory cannot be used: it cannot
// be created, listed, locked, or a segment cannot be opened or repaired.
var ErrUnusable = errors.New("seglog: directory unusable")

// ErrLocked is returned by Open when another Log (of this or another process)
// has the directory open.
var ErrLocked = errors.New("seglog: directory in use by another log")

// ErrFailed wraps the write or fdatasync error that stopped the writer. After
// it every append fails with it: the state of the file after a failed
// fdatasync is unknown, so the log must be closed and opened again (which
// recovers what is on disk).
var ErrFailed = errors.New("seglog: log failed")

// MaxMessageSize is the largest message Append accepts, in bytes.
const MaxMessageSize = 16 << 20

// Defaults of the Options fields left zero.
const (
	DefaultSegmentSize      = 64 << 20
	DefaultCacheBytes       = 64 << 20
	DefaultGroupCacheBytes  = 8 << 20
	DefaultResolveDelay     = 5 * time.Millisecond
	DefaultCommitInterval   = time.Millisecond
	DefaultCompactLiveRatio = 0.25
)

// MinSegmentSize is the smallest Options.SegmentSize. A record never spans
// segments: an append whose records do not fit in one segment fails with
// ErrTooLarge.
const MinSegmentSize = 64 << 10

// Options configure a Log. The zero value of each field selects its default.
type Options struct {
	// Dir holds the segment files; it is created if missing.
	Dir string
	// SegmentSize is the size of each segment file (default 64 MiB). A
	// record never spans segments, so a message must fit in one.
	SegmentSize int64
	// NoSync skips fdatasync: data survives a crash of the process but not
	// of the machine.
	NoSync bool
	// CacheBytes bounds the tail cache of all groups together (default 64 MiB;
	// negative disables the cache).
	CacheBytes int64
	// GroupCacheBytes bounds one group's tail cache (default 8 MiB).
	GroupCacheBytes int64
	// ResolveDelay is how long resolutions may wait for an append commit to
	// ride along before they are committed alone (default 5 ms).
	ResolveDelay time.Duration
	// CommitInterval is the longest an append waits for others to share its
	// commit (default 1 ms; negative: none). A commit starts once it holds as
	// many appends as the last commit answered plus those queued while it ran
	// (appenders with several appends in flight come back with their next
	// ones as they are answered), and at least CommitMinAppends, or
	// CommitInterval after its oldest append was queued, whichever comes
	// first; and at once while appends come more than half a commit's time
	// apart (moving averages of both): a steady publisher's next message
	// would come about when the commit could have ended, so waiting would
	// only add latency (with CommitMinAppends above 1 it waits still). An append
	// is thus answered at most CommitInterval plus one commit (write and
	// fdatasync) after it was queued, or after the commit running when it
	// was queued ended, if that is later.
	CommitInterval time.Duration
	// CommitMinAppends is the fewest appends a commit waits for (within
	// CommitInterval; default 1). Above 1, appends arriving apart at low
	// rates share commits, fewer fdatasyncs per append, at the price of up
	// to CommitInterval of latency each.
	CommitMinAppends int
	// CompactLiveRatio: a sealed segment whose live records fall below this
	// fraction of its records is copied forward (default 0.25; negative
	// disables compaction).
	CompactLiveRatio float64
	// ReadOnly opens the log to look at it only (the offline check): Open
	// changes nothing (no torn tail is cut, nothing quarantined, no
	// segment created or removed) and reports what it found; appends fail
	// with ErrReadOnly. It fails with ErrLocked while another Log has the
	// directory open.
	ReadOnly bool
	// OnAppend, if set, is called after each commit that added entries to a
	// group, with the group's new head, on the notifier goroutine after that
	// commit's callbacks.
	OnAppend func(group, head uint64)
	// AfterCallbacks, if set, is called on the notifier goroutine once a
	// commit's callbacks (and OnAppend calls) have run, so that work they
	// deferred can be done once per commit.
	AfterCallbacks func()
	// Logger receives the log's messages; nil discards them.
	Logger *slog.Logger
}

// withDefaults returns o with defaults filled in, or an error wrapping
// ErrBadOptions.
func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" {
		return o, fmt.Errorf("%w: Dir is empty", ErrBadOptions)
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	if o.SegmentSize < MinSegmentSize || o.SegmentSize > 1<<40 {
		return o, fmt.Errorf("%w: SegmentSize %d (want %d..%d)", ErrBadOptions, o.SegmentSize, MinSegmentSize, int64(1)<<40)
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.GroupCacheBytes == 0 {
		o.GroupCacheBytes = DefaultGroupCacheBytes
	}
	if o.CacheBytes < 0 || o.GroupCacheBytes < 0 {
		o.CacheBytes, o.GroupCacheBytes = 0, 0
	}
	if o.ResolveDelay == 0 {
		o.ResolveDelay = DefaultResolveDelay
	}
	if o.ResolveDelay < 0 {
		return o, fmt.Errorf("%w: ResolveDelay %v", ErrBadOptions, o.ResolveDelay)
	}
	if o.CommitInterval == 0 {
		o.CommitInterval = DefaultCommitInterval
	}
	if o.CommitMinAppends == 0 {
		o.CommitMinAppends = 1
	}
	if o.CommitMinAppends < 0 || o.CommitMinAppends > maxBatchOps {
		return o, fmt.Errorf("%w: CommitMinAppends %d (want 1..%d)", ErrBadOptions, o.CommitMinAppends, maxBatchOps)
	}
	if o.CommitInterval > time.Second {
		return o, fmt.Errorf("%w: CommitInterval %v (want at most 1s)", ErrBadOptions, o.CommitInterval)
	}
	if o.CompactLiveRatio == 0 {
		o.CompactLiveRatio = DefaultCompactLiveRatio
	}
	if o.CompactLiveRatio > 1 {
		return o, fmt.Errorf("%w: CompactLiveRatio %v (want at most 1)", ErrBadOptions, o.CompactLiveRatio)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Range is the closed interval of offsets First..Last.
type Range struct{ First, Last uint64 }

// GroupState is the durable state of a group: what a checkpoint holds and
// what Open and AddGroup take.
type GroupState struct {
	// Head is the highest offset ever appended.
	Head uint64
	// Cursor: every offset <= Cursor is resolved. Cursor <= Head.
	Cursor uint64
	// Resolved holds the resolved offsets above Cursor as sorted, disjoint,
	// non-adjacent ranges within Cursor+2..Head (the cursor has advanced
	// over any range starting at Cursor+1).
	Resolved []Range
	// Dropped counts offsets the drop-oldest policy resolved.
	Dropped uint64
	// Lost counts offsets resolved because their record was damaged or gone.
	Lost uint64
}

// Limits bound a group's unresolved messages: the backlog rule every
// backend applies (package internal/backlog). A zero field means no bound;
// DropOldest resolves the oldest unresolved messages (counted as dropped)
// instead of failing with ErrBacklogFull.
type Limits = backlog.Limits

// Result is the outcome of appending a message to one group.
type Result struct {
	// Offset is the message's offset in the group; 0 if Err is set.
	Offset uint64
	Err    error
}

// Entry is one message returned by ReadFrom.
type Entry struct {
	Offset uint64
	// Data is the message as appended. It is shared: never modify it.
	Data []byte
}

// GroupInfo describes a group at one moment.
type GroupInfo struct {
	// Head is the highest offset appended and committed.
	Head uint64
	// Cursor: every offset <= Cursor is resolved (in memory).
	Cursor uint64
	// DurableCursor: every offset <= DurableCursor is resolved durably (in a
	// committed resolve record or a persisted checkpoint).
	DurableCursor uint64
	// Messages and Bytes count the unresolved messages. Bytes is exact while
	// the messages of each run have one size; otherwise resolving a message
	// that is no longer cached subtracts its run's average size (see the
	// package doc).
	Messages, Bytes uint64
	// Dropped counts messages resolved by the drop-oldest policy (persisted
	// through checkpoints).
	Dropped uint64
	// Refused counts appends failed with ErrBacklogFull since Open.
	Refused uint64
	// Lost counts offsets resolved because their record was damaged or gone
	// (found so at Open or while reading; persisted through checkpoints).
	Lost uint64
	// Cached counts the entries in the group's tail cache, and CachedBytes their bytes.
	Cached, CachedBytes uint64
	// Runs is the number of runs in the group's index.
	Runs int
	// Unsynced counts resolutions a crash could still take back: handed to
	// Resolve but not yet in a committed resolve record (a persisted
	// checkpoint may cover some of them already).
	Unsynced uint64
	// Limits are the group's limits.
	Limits Limits
}

// RecoveryReport describes what Open found.
type RecoveryReport struct {
	// Segments and Bytes count the segments scanned and the bytes read.
	Segments int
	Bytes    int64
	// Records counts the valid frames; Live the messages indexed as unresolved.
	Records, Live uint64
	// TornBytes counts the bytes dropped from the torn tail of the last
	// segment (a commit that did not complete).
	TornBytes int64
	// Corrupt counts the damaged stretches found (bad frames that good
	// frames follow, or that end a sealed segment; damaged headers;
	// truncated files); each was copied (up to a bound) under
	// Dir/quarantine and skipped. Damage describes them.
	Corrupt int
	Damage  []Damage
	// Quarantined lists the files written under Dir/quarantine.
	Quarantined []string
	// Garbage counts message records of groups not passed to Open.
	Garbage uint64
	// Lost counts unresolved offsets (at or below a group's head) for which
	// no record was found, because of corruption: they are resolved, so that
	// the cursor can pass them.
	Lost uint64
	// Took is how long recovery took.
	Took time.Duration
}

// Stats are the log's counters since Open.
type Stats struct {
	// Commits counts writer commits; Syncs the fdatasyncs they made (one per
	// commit, none with NoSync); ResolveCommits the commits that held only
	// resolve records.
	Commits, Syncs, ResolveCommits uint64
	// BytesWritten counts frame bytes written; Records the frames; Appends
	// the message records of appends; Moved the records copied by
	// compaction; ResolveRecords the resolve records.
	BytesWritten, Records, Appends, Moved, ResolveRecords uint64
	// Segments is the number of segment files (spare included); SegmentBytes
	// their total size; LiveRecords the indexed unresolved messages.
	Segments     int
	SegmentBytes int64
	LiveRecords  uint64
	// Compactions counts segments copied forward; Removed the segment files
	// deleted.
	Compactions, Removed uint64
	// CacheHits and CacheMisses count entries ReadFrom returned from the
	// tail cache and from disk; CacheBytes is the cache's size now.
	CacheHits, CacheMisses uint64
	CacheBytes             int64
	// CommitFailures counts commits that failed (the first one stops the writer).
	CommitFailures uint64
	// Damaged counts damaged stretches ReadFrom met (their records were
	// resolved as lost; see GroupInfo.Lost).
	Damaged uint64
	// WriteTime is the time spent in the commits' writes and fdatasyncs.
	WriteTime time.Duration
	// CommitWaits counts the times the writer held a batch back for more
	// appends (Options.CommitInterval).
	CommitWaits uint64
	// SparseCommits counts the batches the writer did not hold back because
	// appends were coming more than half a commit's time apart.
	SparseCommits uint64
}

// Damage is one damaged stretch of a segment file.
type Damage struct {
	Segment uint64
	Path    string
	// Pos and Len locate the bytes skipped.
	Pos, Len int64
	Reason   string
}
