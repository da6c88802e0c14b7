package persistence

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// FileName is the name of the database file inside the data directory.
const FileName = "keyline.db"

// ErrLocked is returned by Open when another process holds the database file.
var ErrLocked = errors.New("persistence: database is in use by another process")

// ErrCorrupt is returned by Open when the file in the data directory is not a
// usable Keyline database (corrupt, truncated, or some other kind of file).
var ErrCorrupt = errors.New("persistence: database file is corrupt or not a bbolt database")

// Options configure Open.
type Options struct {
	// NoSync leaves flushing to the OS instead of fsyncing every commit: the data
	// survives a crash of the process but not a power loss.
	NoSync bool
	// OpenTimeout bounds the wait for the file lock another process holds.
	// Zero means one second.
	OpenTimeout time.Duration
	// Logger receives the store's logs; nil discards them.
	Logger *slog.Logger
}

// DB is the open database. It is safe for concurrent use.
type DB struct {
	bolt   *bolt.DB
	path   string
	opts   Options
	log    *slog.Logger
	groups *Groups
}

// Open opens (creating if needed) the database in dir.
func Open(dir string, opts Options) (*DB, error) {
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = time.Second
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("persistence: create data dir: %w", err)
	}
	path := filepath.Join(dir, FileName)
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
	db := &DB{bolt: b, path: path, opts: opts, log: logger}
	if db.groups, err = openGroups(db); err != nil {
		if cerr := b.Close(); cerr != nil {
			logger.Error("close after failed open", "path", path, "err", cerr)
		}
		return nil, err
	}
	return db, nil
}

// openBolt opens the file, turning a bbolt panic over a damaged page (its
// freelist scan walks every page) into ErrCorrupt.
func openBolt(path string, o *bolt.Options) (b *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, r)
		}
	}()
	return bolt.Open(path, 0o600, o)
}

// Path returns the database file's path.
func (db *DB) Path() string { return db.path }

// Close closes the database. It first lets the group store commit what was
// submitted to it and run the callbacks; operations after Close fail with ErrClosed.
func (db *DB) Close() error {
	db.groups.close()
	if err := db.bolt.Close(); err != nil {
		return fmt.Errorf("persistence: close %s: %w", db.path, err)
	}
	return nil
}

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
