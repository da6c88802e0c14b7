package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/keyline-mq/keyline/internal/frame"
)

// Spill keeps the frames of messages that sessions hold but cannot send yet
// (their clients do not read) in files instead of memory: an outbox keeps up
// to After bytes of frames in memory, and writes the frames of the messages
// it queues beyond that to a file of its own, read back in order as the
// client drains them. A client that stops reading then costs the broker
// disk (the kernel's page cache, which it may write out and drop), not heap
// that the garbage collector's headroom multiplies. The files are not
// durable and hold nothing the broker needs after a restart: NewSpill
// empties the directory, and a session's file is emptied as soon as it holds
// nothing live and removed when its outbox goes (a persistent session's
// messages go cold instead once their records are committed).
type Spill struct {
	dir   string
	after int64
	// maxFiles bounds the files open at once (one per spilling outbox);
	// past it an outbox keeps its frames in memory, as without a Spill.
	maxFiles int64

	next  atomic.Uint64 // names files
	files atomic.Int64  // open now

	// Bytes is the bytes of frames held in the files; Spilled and Loaded
	// count the messages written and read back; Errors the writes and
	// reads that failed (a failed write keeps the frame in memory, a
	// failed read drops the message, counted in Stats.LoadErrors too).
	Bytes                   atomic.Int64
	Spilled, Loaded, Errors atomic.Uint64
	// Cooled counts the messages of persistent sessions whose frames were
	// let go past the threshold instead (their Store holds them: they are
	// read back from it, offheap.go).
	Cooled atomic.Uint64
}

// DefaultSpillFiles is how many outboxes may spill at once.
const DefaultSpillFiles = 1024

// NewSpill makes dir (removing whatever a previous process left in it) the
// directory of the spill files; each outbox keeps up to after bytes of
// frames in memory before it spills.
func NewSpill(dir string, after int64) (*Spill, error) {
	if after <= 0 {
		return nil, fmt.Errorf("outbox: spill threshold %d: want a positive number of bytes", after)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("outbox: empty the spill directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("outbox: spill directory: %w", err)
	}
	return &Spill{dir: dir, after: after, maxFiles: DefaultSpillFiles}, nil
}

// Dir is the directory of the spill files.
func (s *Spill) Dir() string { return s.dir }

// spillFile is one outbox's spill: records appended at end, read back in
// the order they were written. Its outbox's lock guards it.
type spillFile struct {
	s       *Spill
	f       *os.File
	end     int64 // bytes written
	done    int64 // the prefix whose records were all taken
	punched int64 // the prefix whose blocks were given back
	live    int   // records not taken
	bytes   int64 // and their bytes
}

// punchStep is how much of a taken prefix is given back to the file system
// at a time.
const punchStep = 1 << 20

// open returns a new spill file, or nil when too many are open or the file
// cannot be created.
func (s *Spill) open() *spillFile {
	if s.files.Add(1) > s.maxFiles {
		s.files.Add(-1)
		return nil
	}
	name := filepath.Join(s.dir, strconv.FormatUint(s.next.Add(1), 10)+".spill")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		s.files.Add(-1)
		s.Errors.Add(1)
		return nil
	}
	// Unlinked at once: nobody opens it by name, and a crash leaves nothing.
	_ = os.Remove(name)
	return &spillFile{s: s, f: f}
}

// put appends a record holding p and returns its place.
func (sf *spillFile) put(p *frame.Publish) (off int64, n int32, err error) {
	rec := make([]byte, 0, 1+binary.MaxVarintLen64+len(p.B))
	rec = append(rec, p.Version)
	rec = binary.AppendUvarint(rec, uint64(max(p.ExpiresAt, 0)))
	rec = append(rec, p.B...)
	if _, err := sf.f.WriteAt(rec, sf.end); err != nil {
		sf.s.Errors.Add(1)
		return 0, 0, err
	}
	off = sf.end
	sf.end += int64(len(rec))
	sf.live++
	sf.bytes += int64(len(rec))
	sf.s.Bytes.Add(int64(len(rec)))
	sf.s.Spilled.Add(1)
	return off, int32(len(rec)), nil
}

// read returns the frame of the record at off (n bytes).
func (sf *spillFile) read(off int64, n int32) (*frame.Publish, error) {
	b := make([]byte, n)
	if _, err := sf.f.ReadAt(b, off); err != nil {
		sf.s.Errors.Add(1)
		return nil, err
	}
	if len(b) < 2 {
		sf.s.Errors.Add(1)
		return nil, errors.New("outbox: spilled record damaged")
	}
	exp, k := binary.Uvarint(b[1:])
	if k <= 0 {
		sf.s.Errors.Add(1)
		return nil, errors.New("outbox: spilled record damaged")
	}
	p, err := frame.Parse(b[1+k:], b[0], int64(exp))
	if err != nil {
		sf.s.Errors.Add(1)
		return nil, err
	}
	return p, nil
}

// release lets the record at off go: once every record is taken the file
// starts over, empty; a prefix of taken records is given back meanwhile.
func (sf *spillFile) release(off int64, n int32) {
	sf.live--
	sf.bytes -= int64(n)
	sf.s.Bytes.Add(-int64(n))
	if off == sf.done {
		sf.done = off + int64(n)
	}
	if sf.live == 0 {
		_ = sf.f.Truncate(0)
		sf.end, sf.done, sf.punched = 0, 0, 0
		return
	}
	if to := sf.done &^ (punchStep - 1); to > sf.punched {
		// Best effort: without hole punching the file keeps its size
		// until it is empty again.
		_ = syscall.Fallocate(int(sf.f.Fd()), 0x01|0x02, sf.punched, to-sf.punched) // FALLOC_FL_KEEP_SIZE|FALLOC_FL_PUNCH_HOLE
		sf.punched = to
	}
}

// close removes the file (its outbox is discarded).
func (sf *spillFile) close() {
	sf.s.Bytes.Add(-sf.bytes)
	_ = sf.f.Close()
	sf.s.files.Add(-1)
}
