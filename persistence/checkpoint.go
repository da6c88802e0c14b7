package persistence

import (
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// checkpointer writes each group's segment log state (head, cursor, resolved
// ranges, drops) and member figures into the data file every interval, when
// anything changed; the log may then delete the segments the checkpoint made
// unnecessary (their resolve records are covered). Close takes a last one.
type checkpointer struct {
	s        *Groups
	interval time.Duration
	stopC    chan struct{}
	done     chan struct{}
	once     sync.Once
	err      error

	// Owned by the checkpointer's goroutine.
	lastCommits uint64
}

func (c *checkpointer) start(s *Groups, interval time.Duration) {
	c.s, c.interval = s, interval
	c.stopC, c.done = make(chan struct{}), make(chan struct{})
	go c.run()
}

func (c *checkpointer) run() {
	defer close(c.done)
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-c.stopC:
			c.err = c.take(true)
			return
		case <-t.C:
			if err := c.take(false); err != nil {
				c.s.lg.Error("persistence: checkpoint failed; retried next interval", "error", err)
			}
		}
	}
}

// stop takes a last checkpoint and stops the goroutine.
func (c *checkpointer) stop() error {
	c.once.Do(func() { close(c.stopC) })
	<-c.done
	return c.err
}

// take writes a checkpoint if anything changed since the last one (force:
// always, when closing).
func (c *checkpointer) take(force bool) error {
	s := c.s
	commits := s.log.Stats().Commits
	dirty := false
	s.mu.RLock()
	for _, g := range s.mu.groups {
		dirty = dirty || g.dirty
	}
	s.mu.RUnlock()
	if !force && !dirty && commits == c.lastCommits {
		return nil
	}
	snap := s.log.Checkpoint()
	type write struct {
		id   uint64
		name string
		v    []byte
	}
	var writes []write
	s.mu.Lock()
	for id, gs := range snap.Groups {
		g := s.mu.byID[id]
		if g == nil {
			continue // deleted
		}
		st := groupState{GroupState: gs, lastSeen: g.lastSeen, active: g.active}
		writes = append(writes, write{id, g.name, st.encode()})
		g.dirty = false
	}
	s.mu.Unlock()
	err := s.db.commit.do(func(tx *bolt.Tx) error {
		root := tx.Bucket(groupsBucket)
		for _, w := range writes {
			// A group deleted meanwhile has left byID before a new group of
			// its name can have a bucket.
			s.mu.RLock()
			live := s.mu.byID[w.id] != nil
			s.mu.RUnlock()
			bk := root.Bucket([]byte(w.name))
			if bk == nil || !live {
				continue
			}
			if err := bk.Put(stateKey, w.v); err != nil {
				return fatal(err)
			}
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return nil
		}
		s.mu.Lock()
		for _, w := range writes {
			if g := s.mu.groups[w.name]; g != nil {
				g.dirty = true
			}
		}
		s.mu.Unlock()
		return fmt.Errorf("persistence: checkpoint: %w", err)
	}
	s.log.Checkpointed(snap)
	c.lastCommits = commits
	return nil
}
