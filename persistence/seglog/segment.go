package seglog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

const (
	segSuffix = ".seg"
	tmpSuffix = ".seg.tmp"
	// zeroChunk is the size of the zero writes that prepare a segment.
	zeroChunk = 1 << 20
)

// segment is one segment file. Its counters are guarded by Log.mu; f is
// written only by the writer goroutine (and by recovery before it starts).
type segment struct {
	id   uint64
	path string
	f    *os.File
	size int64

	// version is the segment's format (1: no header); its frames start at
	// base (segHeaderSize, 0 for format 1). Set before the writer starts,
	// with the header and what Open found of it.
	version  uint32
	base     int64
	hdr      segHeader
	hdrState headerState

	// Guarded by Log.mu.
	end     int64  // end of the committed frames; the active segment's next write position
	records uint64 // committed frames
	msgRefs uint64 // group references of the committed message records
	live    uint64 // references the index points at (unresolved, not moved away)
	sealed  bool   // no frame will be written to it again
	pins    int    // readers between pin and unpin
	removed bool   // unlinked; f is closed when pins drops to 0
	// surveyLive is live when the compactor last found the segment not
	// worth copying (its live records' bytes were not sparse: they are
	// shared by several groups); 0 if it never did. It looks again once
	// live has halved.
	surveyLive uint64
	// compacting is set while the compactor copies its live records
	// forward; compacted once it did (a segment is compacted once per Open,
	// so that records it could not move are not copied again and again).
	compacting, compacted bool
}

func segName(id uint64) string { return fmt.Sprintf("%020d%s", id, segSuffix) }

// listSegments returns the ids of the segment files in dir, ascending, and
// removes leftover temporary files.
func listSegments(dir string) ([]uint64, error) { return segmentIDs(dir, true) }

// listSegmentsReadOnly is listSegments without removing anything.
func listSegmentsReadOnly(dir string) ([]uint64, error) { return segmentIDs(dir, false) }

func segmentIDs(dir string, removeTmp bool) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, tmpSuffix) {
			if !removeTmp {
				continue
			}
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, err
			}
			continue
		}
		if !strings.HasSuffix(name, segSuffix) || !e.Type().IsRegular() {
			continue
		}
		base := strings.TrimSuffix(name, segSuffix)
		id, err := strconv.ParseUint(base, 10, 64)
		if err != nil || len(base) != 20 {
			continue
		}
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// openSegment opens an existing segment file.
func openSegment(dir string, id uint64) (*segment, error) {
	return openSegmentMode(dir, id, os.O_RDWR)
}

func openSegmentMode(dir string, id uint64, mode int) (*segment, error) {
	path := filepath.Join(dir, segName(id))
	f, err := os.OpenFile(path, mode, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	s := &segment{id: id, path: path, f: f, size: fi.Size()}
	h, st, err := readSegHeader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if st == headerNone && v2FrameAt(f, segHeaderSize) {
		// A header gone to zeros (a bad sector) before frames of the
		// current format: damaged, not a format 1 segment.
		h, st = segHeader{version: FormatVersion, id: id, size: s.size}, headerDamaged
	}
	s.version, s.hdr, s.hdrState = 1, h, st
	if st == headerOK || st == headerDamaged {
		s.version, s.base = h.version, segHeaderSize
	}
	return s, nil
}

// createSegment creates segment id in dir, size bytes of zeros, durably
// (unless noSync): written under a temporary name, synced, renamed, and the
// directory synced. Zeros are written rather than allocated with fallocate:
// on ext4, writing into unwritten extents is a metadata change that each
// fdatasync would have to journal (see the package doc for the figures).
func createSegment(dir string, id uint64, size int64, noSync bool) (*segment, error) {
	path := filepath.Join(dir, segName(id))
	tmp := path[:len(path)-len(segSuffix)] + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*segment, error) {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := zeroRange(f, 0, size); err != nil {
		return fail(err)
	}
	if _, err := f.WriteAt(appendSegHeader(nil, segHeader{version: FormatVersion, id: id, size: size}), 0); err != nil {
		return fail(err)
	}
	if !noSync {
		if err := fdatasync(f); err != nil {
			return fail(err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if !noSync {
		if err := syncDir(dir); err != nil {
			f.Close()
			return nil, err
		}
	}
	h := segHeader{version: FormatVersion, id: id, size: size}
	return &segment{id: id, path: path, f: f, size: size, version: FormatVersion, base: segHeaderSize, end: segHeaderSize, hdr: h, hdrState: headerOK}, nil
}

// writeHeader gives an unused headerless segment (a format 1 spare) a
// header of the current format, durably.
func (s *segment) writeHeader(noSync bool) error {
	if _, err := s.f.WriteAt(appendSegHeader(nil, segHeader{version: FormatVersion, id: s.id, size: s.size}), 0); err != nil {
		return err
	}
	if !noSync {
		if err := fdatasync(s.f); err != nil {
			return err
		}
	}
	s.version, s.base, s.end = FormatVersion, segHeaderSize, segHeaderSize
	s.hdr, s.hdrState = segHeader{version: FormatVersion, id: s.id, size: s.size}, headerOK
	return nil
}

var zeros = make([]byte, zeroChunk)

// zeroRange writes zeros over [from, to) of f.
func zeroRange(f *os.File, from, to int64) error {
	for off := from; off < to; {
		n := min(int64(len(zeros)), to-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}

func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// preparer creates the next segment in the background, so that a roll never
// waits for zero-filling: the writer takes a ready segment from ready and
// asks for the next one on req. It keeps at most one spare.
type preparer struct {
	dir    string
	size   int64
	noSync bool
	req    chan uint64   // ids to prepare; capacity 1; closed at shutdown
	ready  chan prepared // capacity 1
	wg     sync.WaitGroup
}

type prepared struct {
	seg *segment
	err error
}

// startPreparer starts the goroutine; close stops it.
func startPreparer(dir string, size int64, noSync bool) *preparer {
	p := &preparer{dir: dir, size: size, noSync: noSync, req: make(chan uint64, 1), ready: make(chan prepared, 1)}
	p.wg.Add(1)
	go p.run()
	return p
}

// run prepares the segments asked for until req is closed.
func (p *preparer) run() {
	defer p.wg.Done()
	for id := range p.req {
		s, err := createSegment(p.dir, id, p.size, p.noSync)
		if err != nil {
			err = fmt.Errorf("seglog: prepare segment %d: %w", id, err)
		}
		p.ready <- prepared{s, err}
	}
}

// close stops run (after the current preparation) and closes a spare that
// was not taken; the file stays on disk as the next Open's spare.
func (p *preparer) close() {
	close(p.req)
	p.wg.Wait()
	select {
	case pr := <-p.ready:
		if pr.seg != nil {
			pr.seg.f.Close()
		}
	default:
	}
}

// HasRecords reports whether any segment file in dir holds a committed
// frame. A missing dir holds none.
func HasRecords(dir string) (bool, error) {
	ids, err := listSegmentsReadOnly(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, id := range ids {
		s, err := openSegmentReadOnly(dir, id)
		if err != nil {
			return false, err
		}
		has := s.holdsData()
		s.f.Close()
		if has {
			return true, nil
		}
	}
	return false, nil
}

// openSegmentReadOnly opens an existing segment file for reading only.
func openSegmentReadOnly(dir string, id uint64) (*segment, error) {
	return openSegmentMode(dir, id, os.O_RDONLY)
}

// holdsData reports whether the segment's first frame position holds
// anything (a frame, or the damaged remains of one).
func (s *segment) holdsData() bool {
	var h [4]byte
	n, _ := s.f.ReadAt(h[:], s.base)
	return n == 4 && binary.LittleEndian.Uint32(h[:]) != 0
}

// v2FrameAt reports whether a frame header of the current format (its own
// checksum matching) is at pos of f.
func v2FrameAt(f *os.File, pos int64) bool {
	var h [frameHeaderV2]byte
	if n, _ := f.ReadAt(h[:], pos); n < len(h) {
		return false
	}
	_, _, st := parseHeader(h[:], FormatVersion, 1<<40)
	return st == frameOK
}
