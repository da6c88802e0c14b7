package seglog

import (
	"errors"
	"fmt"
	"io"
)

// Backup copies the log while it serves, for an online backup of the data
// dir. Its protocol, with the caller's store of checkpoints (bbolt):
//
//  1. StartBackup pins every segment file: none the backup may need is
//     closed, and a segment unlinked meanwhile is still read through its
//     open file.
//  2. The caller opens a read transaction of its checkpoints.
//  3. Seal pins the segments added since step 1 and records, for each one,
//     the end of its committed frames.
//  4. The caller copies its transaction, ends it, and copies each segment
//     with CopySegment; then Close.
//
// Why it is consistent: a checkpoint the transaction sees was taken from
// durable commits only (invariant 3), so its heads lie within the ends Seal
// records; a segment deleted before step 1 was removable under a checkpoint
// persisted before step 1 (invariant 7), which the transaction sees or
// supersedes. Records committed after Seal are not copied; records between
// the checkpoint and Seal are, and recovery replays them as after a crash.
// A copied segment holds its committed frames and zeros after them (its
// header names its size), exactly what recovery reads in a live one.
type Backup struct {
	l      *Log
	pinned []*segment
	sealed bool
}

// BackupSegment is one segment file as a backup copies it.
type BackupSegment struct {
	// Name is the file's name in the segments directory.
	Name string
	// Size is the file's size; End is where its committed frames end (the
	// rest of a copy is zeros).
	Size, End int64

	seg *segment
}

// ErrBackupClosed is returned by a Backup used after Close, or sealed twice.
var ErrBackupClosed = errors.New("seglog: backup already sealed or closed")

// StartBackup begins an online backup (step 1 of the protocol on Backup).
func (l *Log) StartBackup() (*Backup, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return nil, ErrClosed
	}
	b := &Backup{l: l}
	for _, s := range l.mu.segs {
		l.pinLocked(s)
		b.pinned = append(b.pinned, s)
	}
	return b, nil
}

// Seal records what the backup copies: every segment from the oldest
// pinned one on, each up to the end of its committed frames now (step 3).
func (b *Backup) Seal() ([]BackupSegment, error) {
	l := b.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if b.sealed || b.pinned == nil {
		return nil, ErrBackupClosed
	}
	if l.mu.closed {
		return nil, ErrClosed
	}
	b.sealed = true
	have := make(map[*segment]bool, len(b.pinned))
	for _, s := range b.pinned {
		have[s] = true
	}
	for _, s := range l.mu.segs {
		if !have[s] {
			l.pinLocked(s)
			b.pinned = append(b.pinned, s)
		}
	}
	out := make([]BackupSegment, 0, len(b.pinned))
	for _, s := range b.pinned {
		if s.removed {
			// Deleted after step 1: a checkpoint persisted before the
			// caller's transaction made it removable, so nothing the
			// transaction sees needs it.
			continue
		}
		out = append(out, BackupSegment{Name: segName(s.id), Size: s.size, End: s.end, seg: s})
	}
	return out, nil
}

// CopySegment writes s's copy to w: its committed frames, then zeros up to
// its size. It may run while the log serves (committed frames do not
// change), also for a segment deleted since the backup began.
func (b *Backup) CopySegment(w io.Writer, s BackupSegment) error {
	if !b.sealed || b.pinned == nil {
		return ErrBackupClosed
	}
	if _, err := io.Copy(w, io.NewSectionReader(s.seg.f, 0, s.End)); err != nil {
		return fmt.Errorf("seglog: backup %s: %w", s.Name, err)
	}
	for rest := s.Size - s.End; rest > 0; {
		n := min(rest, int64(len(zeros)))
		if _, err := w.Write(zeros[:n]); err != nil {
			return fmt.Errorf("seglog: backup %s: %w", s.Name, err)
		}
		rest -= n
	}
	return nil
}

// Close ends the backup and lets go of the segments it pinned.
func (b *Backup) Close() {
	l := b.l
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range b.pinned {
		l.unpinLocked(s)
	}
	b.pinned, b.sealed = nil, true
}
