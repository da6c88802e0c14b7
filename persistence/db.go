package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/keyline-mq/keyline/persistence/seglog"
)

// FileName is the name of the database file inside the data directory.
const FileName = "keyline.db"

// SegmentsDir is the directory of the group message log inside the data directory.
const SegmentsDir = "segments"

// ErrLocked is returned by Open when another process holds the database file.
var ErrLocked = errors.New("persistence: database is in use by another process")

// ErrCorrupt is returned by Open when the file in the data directory is not a
// usable Keyline database (corrupt, truncated, or some other kind of file).
var ErrCorrupt = errors.New("persistence: database file is corrupt or not a bbolt database")

// ErrEmptyFile is returned by Open for an empty database file in a data
// directory that holds anything else (a segment log): the file that recorded
// the groups and sessions is gone, and starting afresh would lose them.
var ErrEmptyFile = errors.New("persistence: database file is empty")

// ErrMissingFile is returned by Open when the database file is missing
// beside a segment log that holds records: starting afresh would take every
// record for garbage and delete it.
var ErrMissingFile = errors.New("persistence: database file is missing")

// DefaultSegmentSize is the size of the message log's segment files unless
// Options.SegmentSize says otherwise.
const DefaultSegmentSize = 16 << 20

// DefaultCommitInterval is how long an append to the message log waits for
// others to share its commit unless Options.CommitInterval says otherwise.
const DefaultCommitInterval = seglog.DefaultCommitInterval

// Options configure Open.
type Options struct {
	// NoSync leaves flushing to the OS instead of fsyncing every commit: the data
	// survives a crash of the process but not a power loss.
	NoSync bool
	// OpenTimeout bounds the wait for the file lock another process holds.
	// Zero means one second.
	OpenTimeout time.Duration
	// SegmentSize is the size of the message log's segment files (0:
	// DefaultSegmentSize). Each is written with zeros when it is created.
	SegmentSize int64
	// CacheBytes bounds the message log's in-memory tail (0: seglog's default).
	CacheBytes int64
	// CommitInterval and CommitMinAppends say how long, and for how many
	// appends, a commit of the message log waits for appends to share it
	// (seglog.Options; 0: its defaults, a negative interval: no waiting).
	CommitInterval   time.Duration
	CommitMinAppends int
	// CheckpointInterval is how often the groups' state is checkpointed into
	// the database file when it changed (0: one second).
	CheckpointInterval time.Duration
	// Logger receives the store's logs; nil discards them.
	Logger *slog.Logger
}

// DB is the open data directory: the bbolt file (group metadata, dead
// letters, checkpoints, sessions, retained messages), written by one
// committer goroutine, and the segment log of group messages. It is safe for
// concurrent use.
type DB struct {
	bolt   *bolt.DB
	path   string
	opts   Options
	log    *slog.Logger
	commit *committer
	groups *Groups
}

// Open opens (creating if needed) the data directory dir.
func Open(dir string, opts Options) (*DB, error) {
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = time.Second
	}
	if opts.CheckpointInterval <= 0 {
		opts.CheckpointInterval = time.Second
	}
	if opts.SegmentSize == 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("persistence: create data dir: %w", err)
	}
	path := filepath.Join(dir, FileName)
	if err := checkDataDir(dir, path); err != nil {
		return nil, err
	}
	b, err := openBolt(path, &bolt.Options{
		Timeout:        opts.OpenTimeout,
		NoSync:         opts.NoSync,
		FreelistType:   bolt.FreelistMapType,
		NoFreelistSync: true,
	})
	if err != nil {
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			return nil, fmt.Errorf("%w: %s (is another keyline running on this data dir?)", ErrLocked, path)
		case errors.Is(err, ErrCorrupt):
			return nil, err
		case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch),
			errors.Is(err, berrors.ErrChecksum),
			strings.HasPrefix(err.Error(), "file size too small"): // bbolt has no sentinel for a truncated file
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
		}
		return nil, fmt.Errorf("persistence: open %s: %w", path, err)
	}
	if err := checkFormat(b, path, logger); err != nil {
		if cerr := b.Close(); cerr != nil {
			logger.Error("close after failed open", "path", path, "error", cerr)
		}
		return nil, err
	}
	removeBackupLeftovers(dir) // the lock is ours now: no backup of another process is running
	db := &DB{bolt: b, path: path, opts: opts, log: logger}
	db.commit = newCommitter(b, logger)
	if db.groups, err = openGroups(db, filepath.Join(dir, SegmentsDir)); err != nil {
		db.commit.close()
		if cerr := b.Close(); cerr != nil {
			logger.Error("close after failed open", "path", path, "error", cerr)
		}
		return nil, err
	}
	return db, nil
}

// openBolt opens the file, turning a bbolt panic over a damaged page (its
// freelist scan walks every page) into ErrCorrupt. A file shorter than its
// own meta page says is refused before bbolt maps it: touching the missing
// pages would kill the process with SIGBUS.
func openBolt(path string, o *bolt.Options) (b *bolt.DB, err error) {
	if err := checkLength(path); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, r)
		}
	}()
	return bolt.Open(path, 0o600, o)
}

// Path returns the database file's path.
func (db *DB) Path() string { return db.path }

// Close closes the data directory: the group store checkpoints and closes its
// message log, the committer commits what was submitted, and the file closes.
// Operations after Close fail with ErrClosed.
func (db *DB) Close() error {
	errs := []error{db.groups.close()}
	db.commit.close()
	if err := db.bolt.Close(); err != nil {
		errs = append(errs, fmt.Errorf("persistence: close %s: %w", db.path, err))
	}
	return errors.Join(errs...)
}

// CommitStats are the data file committer's counters since Open.
type CommitStats struct {
	// Commits counts transactions that committed; Failures those that did not.
	Commits, Failures uint64
	// FailedOps counts operations that failed (alone, or with their transaction).
	FailedOps uint64
	// Unchanged counts batches rolled back because none of their operations
	// changed anything (deletes of keys that were not there).
	Unchanged uint64
}

// CommitStats returns the committer's counters.
func (db *DB) CommitStats() CommitStats {
	return CommitStats{Commits: db.commit.commits.Load(), Failures: db.commit.failures.Load(), FailedOps: db.commit.failedOps.Load(), Unchanged: db.commit.rollbacks.Load()}
}

// LogStats returns the segment log's counters.
func (db *DB) LogStats() seglog.Stats { return db.groups.log.Stats() }

// Check runs bbolt's consistency check over the whole file (every page
// reachable once, freelist consistent, keys ordered) and returns ErrCorrupt
// listing what it found, or nil. It reads the whole file and holds off every
// writer meanwhile: for tests, tools and an operator's request, not for every open.
func (db *DB) Check() error {
	// In a write transaction (rolled back): bbolt's check reads the freelist,
	// which a concurrent writer would change under it.
	var problems []string
	errRollback := errors.New("rollback")
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			problems = append(problems, err.Error())
		}
		return errRollback
	})
	if err != nil && err != errRollback {
		return fmt.Errorf("persistence: check %s: %w", db.path, err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, db.path, strings.Join(problems, "; "))
	}
	return nil
}

// checkLength compares the file's length with the page count its newest
// valid meta page records (bbolt's layout: a 16-byte page header, then magic,
// version, page size, flags, root bucket, freelist, page count, txid and an
// FNV-64a checksum of the fields before it). A file with no valid meta page
// is left to bbolt, which reports it as invalid.
func checkLength(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return nil // bbolt reports it
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return nil
	}
	var pages, txid uint64
	var pageSize uint32
	for _, off := range []int64{0, -1} {
		if off < 0 {
			if pageSize == 0 {
				pageSize = 4096 // the first meta was unreadable: try the usual size
			}
			off = int64(pageSize)
		}
		buf := make([]byte, 80)
		if _, err := f.ReadAt(buf, off); err != nil {
			continue
		}
		le := binary.LittleEndian
		if le.Uint32(buf[16:]) != 0xED0CDAED {
			continue
		}
		h := fnv.New64a()
		h.Write(buf[16:72])
		if h.Sum64() != le.Uint64(buf[72:]) {
			continue
		}
		if t := le.Uint64(buf[64:]); t >= txid {
			txid, pages, pageSize = t, le.Uint64(buf[56:]), le.Uint32(buf[24:])
		}
	}
	if pages == 0 || pageSize == 0 {
		return nil
	}
	if want := int64(pages) * int64(pageSize); fi.Size() < want {
		return fmt.Errorf("%w: %s is %d bytes long, but its own header says %d (the file was truncated)", ErrCorrupt, path, fi.Size(), want)
	}
	return nil
}
