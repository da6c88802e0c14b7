package persistence

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// committer is the one goroutine that writes the data file (bbolt): group
// metadata, dead letters, checkpoints and session state, many operations per
// transaction. Each operation succeeds or fails on its own: one that cannot
// be written (a key bbolt refuses) fails alone, one whose write breaks the
// transaction is taken out and the rest committed again, and a caller is
// answered only after the commit that holds its operation.
type committer struct {
	db  *bolt.DB
	log *slog.Logger

	mu struct {
		sync.Mutex
		ops    []*txOp
		closed bool
	}
	wake chan struct{} // capacity 1
	done chan struct{} // closed when run has returned

	commits, failures, failedOps atomic.Uint64
	rollbacks                    atomic.Uint64 // batches that changed nothing
}

// txOp is one operation. apply changes the transaction; it returns a plain
// error to fail only this operation, having changed nothing, and wraps an
// error with fatal when the transaction may be half-written.
type txOp struct {
	apply func(tx *bolt.Tx) error
	err   error
	skip  bool          // aborted an earlier attempt of this batch
	done  chan struct{} // closed after the commit that settles the op; nil: nobody waits
	// onFail, when set, hears of a failure of an operation nobody waits for.
	onFail func(err error)
	// after, when set, hears the outcome (nil: committed) of an operation
	// nobody waits for, on the committer's goroutine: it must be short.
	after func(err error)
}

// maxTxOps bounds one transaction.
const maxTxOps = 8192

func newCommitter(db *bolt.DB, log *slog.Logger) *committer {
	c := &committer{db: db, log: log, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go c.run()
	return c
}

// fatalError marks an error that leaves the transaction in an unknown state.
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

// errUnchanged is what an apply returns when it succeeded without changing
// anything (a delete of what is not there): a transaction in which no
// operation changed anything is rolled back instead of committed, which
// spares the data file a write (a clean-start client forgetting a session
// it never had, thousands a second in a connect burst).
var errUnchanged = errors.New("persistence: nothing changed")

// errRollback ends a transaction that changed nothing.
var errRollback = errors.New("persistence: nothing to commit")

// fatal wraps err as a fatalError, unless bbolt refused the write before
// changing anything (a key or value it cannot store), which fails the op alone.
func fatal(err error) error {
	switch {
	case err == nil, err == errUnchanged:
		return err
	case errors.Is(err, berrors.ErrKeyRequired), errors.Is(err, berrors.ErrKeyTooLarge),
		errors.Is(err, berrors.ErrValueTooLarge), errors.Is(err, berrors.ErrIncompatibleValue),
		errors.Is(err, berrors.ErrBucketExists), errors.Is(err, berrors.ErrBucketNotFound):
		return err
	}
	return fatalError{err}
}

func isFatal(err error) bool {
	var fe fatalError
	return errors.As(err, &fe)
}

// do runs apply in the committer and returns its outcome once committed.
func (c *committer) do(apply func(tx *bolt.Tx) error) error {
	o := &txOp{apply: apply, done: make(chan struct{})}
	if !c.submit(o) {
		return ErrClosed
	}
	<-o.done
	return o.err
}

// queue runs apply in the committer without waiting; onFail (may be nil)
// hears of a failure. It reports false once the committer is closed.
func (c *committer) queue(apply func(tx *bolt.Tx) error, onFail func(error)) bool {
	return c.submit(&txOp{apply: apply, onFail: onFail})
}

// sync returns once everything submitted before it has been committed (or failed).
func (c *committer) sync() error {
	return c.do(func(*bolt.Tx) error { return errUnchanged }) // settles what came before; writes nothing itself
}

func (c *committer) submit(o *txOp) bool {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return false
	}
	c.mu.ops = append(c.mu.ops, o)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return true
}

// close commits what was submitted and stops the committer.
func (c *committer) close() {
	c.mu.Lock()
	already := c.mu.closed
	c.mu.closed = true
	c.mu.Unlock()
	if !already {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	<-c.done
}

func (c *committer) run() {
	defer close(c.done)
	var ops []*txOp
	for {
		c.mu.Lock()
		n := min(len(c.mu.ops), maxTxOps)
		ops = append(ops[:0], c.mu.ops[:n]...)
		clear(c.mu.ops[:n])
		c.mu.ops = c.mu.ops[n:]
		if len(c.mu.ops) == 0 {
			c.mu.ops = nil // let the backing array go
		}
		closed := c.mu.closed
		c.mu.Unlock()
		if len(ops) == 0 {
			if closed {
				return
			}
			<-c.wake
			continue
		}
		c.commit(ops)
		for i, o := range ops {
			if o.err != nil {
				c.failedOps.Add(1)
				if o.onFail != nil {
					o.onFail(o.err)
				}
			}
			if o.done != nil {
				close(o.done)
			}
			if o.after != nil {
				o.after(o.err)
			}
			ops[i] = nil
		}
	}
}

// commit applies ops in one transaction, retrying without an op that broke it.
func (c *committer) commit(ops []*txOp) {
	for {
		culprit := -1
		err := c.db.Update(func(tx *bolt.Tx) error {
			changed := false
			for i, o := range ops {
				if o.skip {
					continue
				}
				o.err = o.apply(tx)
				switch {
				case o.err == errUnchanged:
					o.err = nil
				case isFatal(o.err):
					culprit = i
					return o.err
				case o.err == nil:
					changed = true
				}
			}
			if !changed {
				return errRollback // every op failed alone or changed nothing
			}
			return nil
		})
		if err == errRollback {
			c.rollbacks.Add(1)
			return
		}
		if err == nil {
			c.commits.Add(1)
			return
		}
		if culprit >= 0 && len(ops) > 1 {
			ops[culprit].skip = true
			ops[culprit].err = fmt.Errorf("persistence: write: %w", err)
			c.log.Error("persistence: an operation broke its transaction; committing the others again", "error", err)
			continue
		}
		c.failures.Add(1)
		err = fmt.Errorf("persistence: commit: %w", err)
		c.log.Error("persistence: commit failed", "ops", len(ops), "error", err)
		for _, o := range ops {
			if !o.skip {
				o.err = err
			}
		}
		return
	}
}
