package seglog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// appendV1Frame appends a format 1 frame of body to dst.
func appendV1Frame(dst, body []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(body)))
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(body, castagnoli))
	return append(dst, body...)
}

// v1Message is a format 1 message record body.
func v1Message(group, offset uint64, msg []byte) []byte {
	b := binary.AppendUvarint([]byte{recMessage}, group)
	b = binary.AppendUvarint(b, offset)
	return append(b, msg...)
}

// writeV1Dir writes what a format 1 log of groups 1 and 2 with n messages
// each looks like: one segment of records (each message once per group,
// with 8-byte frame headers and no segment header), group 1's first half
// resolved, and an all-zero spare.
func writeV1Dir(t *testing.T, dir string, n uint64) {
	t.Helper()
	seg := make([]byte, MinSegmentSize)
	var b []byte
	for i := uint64(1); i <= n; i++ {
		for g := uint64(1); g <= 2; g++ {
			b = appendV1Frame(b, v1Message(g, i, payload(1, i, 40)))
		}
	}
	res := binary.AppendUvarint([]byte{recResolve}, 1)
	res = binary.AppendUvarint(res, 1)
	res = binary.AppendUvarint(res, 1)   // gap from 0
	res = binary.AppendUvarint(res, n/2) // length
	b = appendV1Frame(b, res)
	if len(b) > len(seg) {
		t.Fatalf("%d bytes do not fit in one segment", len(b))
	}
	copy(seg, b)
	if err := os.WriteFile(filepath.Join(dir, segName(1)), seg, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, segName(2)), make([]byte, MinSegmentSize), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOpensFormat1: segments written before format versions existed are
// read as they are, never written again: new records go to a segment of the
// current format, and the old one goes once its records are resolved.
func TestOpensFormat1(t *testing.T) {
	dir := t.TempDir()
	const n = 200
	writeV1Dir(t, dir, n)
	old := readFile(t, filepath.Join(dir, segName(1)))
	opts := smallOpts(t, dir)
	l := openLog(t, opts, map[uint64]GroupState{1: {}, 2: {}})
	if rep := l.Recovery(); rep.Corrupt != 0 || rep.TornBytes != 0 || rep.Live != n+n/2 {
		t.Fatalf("report %+v", rep)
	}
	check := func(g, lo, hi uint64) {
		t.Helper()
		got := readAll(t, l, g, 0)
		if uint64(len(got)) != hi-lo+1 {
			t.Fatalf("group %d: %d entries, want %d..%d", g, len(got), lo, hi)
		}
		for i, e := range got {
			if off := lo + uint64(i); e.Offset != off || !bytes.Equal(e.Data, payload(1, off, 40)) {
				t.Fatalf("group %d: entry %d is %d %q", g, i, e.Offset, e.Data)
			}
		}
	}
	check(1, n/2+1, n)
	check(2, 1, n)
	if off := appendOK(t, l, 2, []byte("new")); off != n+1 {
		t.Fatalf("offset %d", off)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	// The format 1 segment is unchanged; the spare became the active
	// segment, with a header.
	if !bytes.Equal(readFile(t, filepath.Join(dir, segName(1))), old) {
		t.Fatal("the format 1 segment was written")
	}
	b := readFile(t, filepath.Join(dir, segName(2)))
	if h, st := parseSegHeader(b); st != headerOK || h.version != FormatVersion || h.id != 2 {
		t.Fatalf("segment 2 header %+v (%v)", h, st)
	}
	// Resolve everything the old segment holds: it goes at the next checkpoint.
	var offs []uint64
	for i := uint64(1); i <= n; i++ {
		offs = append(offs, i)
	}
	l.Resolve(1, offs)
	l.Resolve(2, offs)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	snap := l.Checkpoint()
	l.Checkpointed(snap)
	if _, err := os.Stat(filepath.Join(dir, segName(1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("format 1 segment still there: %v", err)
	}
	l = reopen(t, l, snap)
	if got := readAll(t, l, 2, 0); len(got) != 1 || string(got[0].Data) != "new" {
		t.Fatalf("after reopen: %+v", got)
	}
}

// TestRefusesNewerFormat: a segment of a newer format stops Open with one
// line naming the file and both versions, before anything is changed.
func TestRefusesNewerFormat(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, smallOpts(t, dir), nil)
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	appendOK(t, l, 1, []byte("x"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, segName(1))
	b := readFile(t, path)
	copy(b, appendSegHeader(nil, segHeader{version: FormatVersion + 1, id: 1, size: int64(len(b))}))
	binary.LittleEndian.PutUint32(b[segHeaderSize:], 0xdeadbeef) // a frame we could not read
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(smallOpts(t, dir), map[uint64]GroupState{1: {}})
	if !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), path) ||
		!strings.Contains(err.Error(), "segment format 3; this keyline reads formats 1 to 2") {
		t.Fatalf("Open = %v", err)
	}
	t.Logf("Open: %v", err)
	if !bytes.Equal(readFile(t, path), b) {
		t.Fatal("Open changed the newer segment")
	}
}

// TestDamageWhileRunning is issue 23's item 11: a record damaged on disk
// after it was written does not stall its groups: ReadFrom skips it to the
// next good frame, quarantines its bytes and resolves its offsets as lost
// (counted), and the cursor goes on.
func TestDamageWhileRunning(t *testing.T) {
	dir := t.TempDir()
	opts := smallOpts(t, dir)
	opts.CacheBytes = -1 // every read from disk
	l := openLog(t, opts, nil)
	for g := uint64(1); g <= 2; g++ {
		if err := l.AddGroup(g, GroupState{}, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	const n = 1200
	for i := uint64(1); i <= n; i++ {
		l.Append([]uint64{1, 2}, payload(1, i, 100), nil)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	segs, _ := segFiles(t, dir)
	b := readFile(t, segs[0])
	fr := frames(b)
	victim := fr[len(fr)/2]
	rec, err := decodeBody(b[victim+frameHeader : frameEndAt(b, victim)])
	if err != nil {
		t.Fatal(err)
	}
	lost, _ := rec.offsetOf(1)
	f, err := os.OpenFile(segs[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{b[victim+frameHeader+9] ^ 0x21}, int64(victim+frameHeader+9)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for g := uint64(1); g <= 2; g++ {
		got := readAll(t, l, g, 1)
		if len(got) != n-1 {
			t.Fatalf("group %d: read %d, want %d", g, len(got), n-1)
		}
		var offs []uint64
		for _, e := range got {
			if e.Offset == lost || !bytes.Equal(e.Data, payload(1, e.Offset, 100)) {
				t.Fatalf("group %d: offset %d holds %q", g, e.Offset, e.Data)
			}
			offs = append(offs, e.Offset)
		}
		l.Resolve(g, offs)
		gi, _ := l.Group(g)
		if gi.Lost != 1 || gi.Messages != 0 || gi.Cursor != n {
			t.Fatalf("group %d after reading and resolving: %+v", g, gi)
		}
	}
	if st := l.Stats(); st.Damaged != 2 {
		t.Fatalf("damaged %d, want 2 (one per group)", st.Damaged)
	}
	if q, _ := filepath.Glob(filepath.Join(dir, quarantineDir, "*")); len(q) != 1 {
		t.Fatalf("quarantine holds %v", q)
	}
}

// TestOneCopyPerAppend is issue 23's items 9 and 10: a message appended to
// many groups is stored once (so a large message to many groups fits in a
// segment, and disk does not grow with the number of groups).
func TestOneCopyPerAppend(t *testing.T) {
	dir := t.TempDir()
	opts := smallOpts(t, dir)
	opts.SegmentSize = 1 << 20
	l := openLog(t, opts, nil)
	var groups []uint64
	for g := uint64(1); g <= 100; g++ {
		if err := l.AddGroup(g, GroupState{}, Limits{}); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g)
	}
	big := bytes.Repeat([]byte("b"), 200<<10)
	for i := range 3 {
		for j, r := range appendWait(t, l, groups, big) {
			if r.Err != nil || r.Offset != uint64(i+1) {
				t.Fatalf("append %d to group %d: %+v", i, j+1, r)
			}
		}
	}
	const n, size = 1000, 1000
	for i := uint64(1); i <= n; i++ {
		l.Append(groups[:50], payload(1, i, size), nil)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	want := uint64(3*len(big) + n*size)
	t.Logf("3 x 200 KB to 100 groups and %d x %d bytes to 50 groups: %d bytes written (%.2f x the messages)", n, size, st.BytesWritten, float64(st.BytesWritten)/float64(want))
	if st.BytesWritten > want*13/10 {
		t.Fatalf("wrote %d bytes for %d bytes of messages", st.BytesWritten, want)
	}
	for _, g := range []uint64{1, 50, 100} {
		got := readAll(t, l, g, 0)
		if wantN := map[bool]int{true: 3 + n, false: 3}[g <= 50]; len(got) != wantN {
			t.Fatalf("group %d holds %d, want %d", g, len(got), wantN)
		}
	}
}

// TestSharedRecordsAreNotCopiedForNothing: when most groups of a shared
// record resolve it, few references stay live, but the record is as large
// as ever: the compactor looks before it copies.
func TestSharedRecordsAreNotCopiedForNothing(t *testing.T) {
	dir := t.TempDir()
	opts := smallOpts(t, dir)
	l := openLog(t, opts, nil)
	groups := []uint64{1, 2, 3, 4, 5}
	for _, g := range groups {
		if err := l.AddGroup(g, GroupState{}, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	const n = 3000 // several segments
	var offs []uint64
	for i := uint64(1); i <= n; i++ {
		l.Append(groups, payload(1, i, 100), nil)
		offs = append(offs, i)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups[:4] { // group 5 keeps everything: 1 of 5 references live
		l.Resolve(g, offs)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	l.wakeCompactor()
	waitFor(t, "the compactor to look at every sealed segment", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, s := range l.mu.segs {
			if s.sealed && (s.compacting || s.surveyLive == 0) {
				return false
			}
		}
		return true
	})
	if st := l.Stats(); st.Moved != 0 || st.Compactions != 0 {
		t.Fatalf("moved %d records in %d compactions", st.Moved, st.Compactions)
	}
	if got := readAll(t, l, 5, 0); len(got) != n {
		t.Fatalf("group 5 holds %d", len(got))
	}
}

// TestDamagedSegmentHeader: a segment header damaged (a flipped byte, or
// zeroed as a bad sector leaves it) is reported, and the frames after it
// are read as they are.
func TestDamagedSegmentHeader(t *testing.T) {
	for _, mode := range []string{"flipped", "zeroed"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			const n = 2000
			buildLog(t, dir, n)
			segs, _ := segFiles(t, dir)
			b := readFile(t, segs[0])
			switch mode {
			case "flipped":
				b[10] ^= 0x01 // the segment id
			case "zeroed":
				clear(b[:segHeaderSize])
			}
			if err := os.WriteFile(segs[0], b, 0o600); err != nil {
				t.Fatal(err)
			}
			l := openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
			rep := l.Recovery()
			if rep.Corrupt != 1 || len(rep.Damage) != 1 || rep.Damage[0].Reason != "damaged segment header" || rep.Lost != 0 {
				t.Fatalf("report %+v", rep)
			}
			checkGroup(t, l, 2, 1, n)
		})
	}
}
