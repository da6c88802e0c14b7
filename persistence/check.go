package persistence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/keyline-mq/keyline/persistence/seglog"
)

// CheckReport is what CheckDir found in a data directory.
type CheckReport struct {
	Dir string
	// Format is keyline.db's data format (0 if it could not be read).
	Format uint64
	// Problems lists the damage found, one line each, naming the file (and
	// the position in it): empty for a sound data dir.
	Problems []string
	// Notes lists what is not damage but will change at the next start
	// (the torn tail of a commit a crash interrupted, to be cut).
	Notes []string
	// Segments and SegmentBytes count the segment files and their bytes.
	Segments     int
	SegmentBytes int64
	// Sessions counts the session records of each kind.
	Sessions map[string]int
	Groups   []GroupCheck
}

// GroupCheck is what the check found of one group.
type GroupCheck struct {
	Name         string
	Head, Cursor uint64
	// Readable counts the unresolved messages whose records are intact.
	Readable uint64
	// Lost counts unresolved messages whose records this check found
	// damaged or missing; LostBefore those lost to damage found earlier.
	Lost, LostBefore uint64
	DeadLetters      uint64
	// BadDeadLetters counts dead letters that cannot be decoded.
	BadDeadLetters uint64
	Quarantined    uint64
}

// CheckDir checks the data directory dir without changing it (the broker
// must not be running on it): keyline.db with bbolt's consistency check,
// its format and every group's records, then every frame of every segment
// (checksums, headers, lengths), and reports per group what is readable.
// The error is for a check that could not run (a data dir in use, not a
// directory); damage goes to the report.
func CheckDir(dir string) (*CheckReport, error) {
	rep := &CheckReport{Dir: dir, Sessions: map[string]int{}}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("persistence: check %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("persistence: check %s: not a directory", dir)
	}
	path := filepath.Join(dir, FileName)
	segDir := filepath.Join(dir, SegmentsDir)
	states := map[uint64]seglog.GroupState{}
	names := map[uint64]*GroupCheck{}
	if err := checkDataDir(dir, path); err != nil {
		rep.Problems = append(rep.Problems, oneLine(err))
	} else if _, err := os.Stat(path); err == nil {
		if err := rep.checkFile(path, states, names); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(segDir); errors.Is(err, os.ErrNotExist) {
		if len(names) > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s is missing: the messages of %d groups are gone", segDir, len(names)))
		}
		return rep, nil
	}
	l, err := seglog.Open(seglog.Options{Dir: segDir, ReadOnly: true}, states)
	switch {
	case errors.Is(err, seglog.ErrLocked):
		return nil, fmt.Errorf("persistence: check %s: in use by a running keyline: stop it first", segDir)
	case err != nil:
		rep.Problems = append(rep.Problems, oneLine(err))
		return rep, nil
	}
	defer l.Close()
	lr := l.Recovery()
	for _, d := range lr.Damage {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d bytes at %d: %s", d.Path, d.Len, d.Pos, d.Reason))
	}
	if lr.TornBytes > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %d bytes of a commit a crash interrupted (never acknowledged) will be cut at the next start", segDir, lr.TornBytes))
	}
	st := l.Stats()
	rep.Segments, rep.SegmentBytes = st.Segments, st.SegmentBytes
	for id, g := range names {
		li, err := l.Group(id)
		if err != nil {
			continue
		}
		g.Head, g.Cursor, g.Readable = li.Head, li.Cursor, li.Messages
		g.Lost = li.Lost - g.LostBefore
		if g.Lost > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("group %q: %d unresolved messages are damaged or missing in %s", g.Name, g.Lost, segDir))
		}
	}
	for _, g := range names {
		rep.Groups = append(rep.Groups, *g)
	}
	slices.SortFunc(rep.Groups, func(a, b GroupCheck) int { return strings.Compare(a.Name, b.Name) })
	return rep, nil
}

// checkFile checks keyline.db and collects every group's checkpoint.
func (rep *CheckReport) checkFile(path string, states map[uint64]seglog.GroupState, names map[uint64]*GroupCheck) (err error) {
	if err := checkLength(path); err != nil {
		rep.Problems = append(rep.Problems, oneLine(err))
		return nil
	}
	b, err := openBolt(path, &bolt.Options{ReadOnly: true, Timeout: time.Second, FreelistType: bolt.FreelistMapType})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("persistence: check %s: in use by a running keyline: stop it first", path)
	case err != nil:
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: not a usable bbolt file: %v", path, oneLine(err)))
		return nil
	}
	defer b.Close()
	defer func() {
		// bbolt panics on some damaged pages.
		if r := recover(); r != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: damaged page: %v", path, r))
		}
	}()
	return b.View(func(tx *bolt.Tx) error {
		// bbolt's check panics, on a goroutine of its own, over a page that
		// is not what its parent says: walk every page first, here, where
		// such a panic can be caught.
		if err := walkAll(tx); err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %v", path, err))
			return nil
		}
		for err := range tx.Check() {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %v", path, err))
		}
		v, err := formatOf(tx)
		switch {
		case err != nil:
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %v", path, err))
		case v > FormatVersion:
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s is data format %d; this keyline reads formats 1 to %d", path, v, FormatVersion))
			return nil
		}
		rep.Format = max(v, 1)
		if sb := tx.Bucket(sessionsBucket); sb != nil {
			// Every kind the file holds, those of older formats too
			// (format 2's clients and subscriptions: check does not migrate).
			if err := sb.ForEachBucket(func(kind []byte) error {
				rep.Sessions[string(kind)] = sb.Bucket(kind).Stats().KeyN
				return nil
			}); err != nil {
				return err
			}
			if rb := sb.Bucket([]byte(KindRecords)); rb != nil {
				checkRecords(rep, path, rb)
			}
		}
		root := tx.Bucket(groupsBucket)
		if root == nil {
			return nil
		}
		return root.ForEach(func(k, v []byte) error {
			if v != nil {
				if string(k) != string(keylineKey) {
					rep.Problems = append(rep.Problems, fmt.Sprintf("%s: groups/%q is a value, not a group", path, k))
				}
				return nil
			}
			g, st, err := loadGroup(root.Bucket(k), string(k), time.Now())
			if err != nil {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s: group %q: %v", path, k, err))
				return nil
			}
			if names[g.meta.ID] != nil {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s: groups %q and %q share id %d", path, k, names[g.meta.ID].Name, g.meta.ID))
				return nil
			}
			gc := &GroupCheck{Name: g.name, DeadLetters: g.dlq.count, Quarantined: g.quarantined, LostBefore: st.Lost}
			if err := root.Bucket(k).Bucket(dlqBucket).ForEach(func(id, v []byte) error {
				if len(id) != 8 {
					gc.BadDeadLetters++
				} else if _, err := decodeDeadLetterEntry(g.name, id, v); err != nil {
					gc.BadDeadLetters++
				}
				return nil
			}); err != nil {
				return err
			}
			if gc.BadDeadLetters > 0 {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s: group %q: %d dead letters cannot be decoded", path, g.name, gc.BadDeadLetters))
			}
			names[g.meta.ID], states[g.meta.ID] = gc, st.GroupState
			return nil
		})
	})
}

// oneLine returns err's message on one line.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// walkAll reads every key of every bucket, turning a bbolt panic over a
// damaged page into an error.
func walkAll(tx *bolt.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("damaged page: %v", r)
		}
	}()
	return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walkBucket(b) })
}

func walkBucket(b *bolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				return walkBucket(nb)
			}
		}
		return nil
	})
}

// checkRecords reports the session records that cannot be decoded (the
// broker starts without their sessions, and keeps them until their clients
// connect again): the first few by client id, then how many in all.
func checkRecords(rep *CheckReport, path string, b *bolt.Bucket) {
	const named = 10
	bad := 0
	err := b.ForEach(func(k, v []byte) error {
		if _, _, err := decodeRecord(string(k), v); err != nil {
			if bad++; bad <= named {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %s", path, oneLine(err)))
			}
		}
		return nil
	})
	if err != nil {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: session records: %s", path, oneLine(err)))
	}
	if bad > named {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %d session records in all cannot be decoded", path, bad))
	}
}
