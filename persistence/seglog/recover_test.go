package seglog

import (
	"bytes"
	"encoding/binary"
	"flag"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var flagFlipSeed = flag.Uint64("seglog.flipseed", 0, "run TestRecoveryByteFlips with only this seed")

// buildLog writes n messages to groups 1 and 2 in small segments, resolves
// the first quarter of group 1, and closes the log.
func buildLog(t testing.TB, dir string, n uint64) {
	t.Helper()
	opts := smallOpts(t, dir)
	opts.Logger = nil
	l, err := Open(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	for g := uint64(1); g <= 2; g++ {
		if err := l.AddGroup(g, GroupState{}, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= n; i++ {
		l.Append([]uint64{1, 2}, payload(1, i, 80+int(i%40)), nil)
		if i%50 == 0 {
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	var res []uint64
	for i := uint64(1); i <= n/4; i++ {
		res = append(res, i)
	}
	l.Resolve(1, res)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// segFiles returns the segment paths of dir, ascending, and the index of
// the last one that holds data.
func segFiles(t testing.TB, dir string) ([]string, int) {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for i, p := range m {
		b := readFile(t, p)
		base := 0
		if string(b[:4]) == segMagic {
			base = segHeaderSize
		}
		if binary.LittleEndian.Uint32(b[base:]) != 0 {
			last = i
		}
	}
	return m, last
}

func readFile(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// frames returns the start positions of the frames of a segment's bytes
// (of either format).
func frames(b []byte) []int {
	var out []int
	pos, hl := 0, frameHeaderV1
	if string(b[:4]) == segMagic {
		pos, hl = segHeaderSize, frameHeaderV2
	}
	for pos+hl <= len(b) {
		n := int(binary.LittleEndian.Uint32(b[pos:]))
		if n == 0 {
			break
		}
		out = append(out, pos)
		pos += hl + n
	}
	return out
}

// frameEnd returns the end of the frame at pos of a format 2 segment's bytes.
func frameEndAt(b []byte, pos int) int {
	return pos + frameHeader + int(binary.LittleEndian.Uint32(b[pos:]))
}

// checkGroup checks that the group holds exactly the messages lo..hi of
// buildLog.
func checkGroup(t testing.TB, l *Log, g, lo, hi uint64) {
	t.Helper()
	got := readAll(t, l, g, 0)
	if uint64(len(got)) != hi-lo+1 {
		t.Fatalf("group %d: %d entries, want %d..%d (first %v)", g, len(got), lo, hi, offsets(got[:min(3, len(got))]))
	}
	for i, e := range got {
		off := lo + uint64(i)
		if e.Offset != off || !bytes.Equal(e.Data, payload(1, off, 80+int(off%40))) {
			t.Fatalf("group %d: entry %d is %d %q", g, i, e.Offset, e.Data)
		}
	}
}

// TestTornTail: the final frame of the last segment is damaged as a crash
// in the middle of the last commit leaves it: only that frame goes (it was
// never acknowledged), and appends go on after it.
func TestTornTail(t *testing.T) {
	for _, mode := range []string{"garbled", "cut", "length"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			const n = 2000 // several segments
			buildLog(t, dir, n)
			// One more message, the last frame of the log.
			l := openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
			if res := appendWait(t, l, []uint64{1, 2}, payload(1, n+1, 80+int((n+1)%40))); res[0].Offset != n+1 || res[1].Offset != n+1 {
				t.Fatalf("append: %+v", res)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			segs, last := segFiles(t, dir)
			if last < 2 {
				t.Fatalf("want several segments, the last with data is %d of %d", last, len(segs))
			}
			b := readFile(t, segs[last])
			fr := frames(b)
			lastFrame := fr[len(fr)-1]
			if !isMessage(b[lastFrame+frameHeader]) {
				t.Fatalf("the last frame is of type %d", b[lastFrame+frameHeader])
			}
			end := frameEndAt(b, lastFrame)
			switch mode {
			case "garbled": // a flipped byte in the body: CRC mismatch
				b[lastFrame+frameHeader+5] ^= 0x40
			case "cut": // the end of the write never reached the disk
				clear(b[lastFrame+frameHeader+3 : end])
			case "length": // an impossible length
				binary.LittleEndian.PutUint32(b[lastFrame:], 0xfffff000)
			}
			if err := os.WriteFile(segs[last], b, 0o600); err != nil {
				t.Fatal(err)
			}
			l = openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
			rep := l.Recovery()
			if rep.TornBytes <= 0 || rep.Corrupt != 0 || rep.Lost != 0 {
				t.Fatalf("report %+v", rep)
			}
			// Close's resolutions of group 1 came before the torn frame.
			checkGroup(t, l, 1, n/4+1, n)
			checkGroup(t, l, 2, 1, n)
			if off := appendOK(t, l, 2, payload(1, n+1, 80+int((n+1)%40))); off != n+1 {
				t.Fatalf("next offset %d, want %d", off, n+1)
			}
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			s := &Snapshot{Groups: map[uint64]GroupState{1: {}, 2: {}}}
			l = reopen(t, l, s)
			if rep := l.Recovery(); rep.TornBytes != 0 || rep.Corrupt != 0 {
				t.Fatalf("second reopen: %+v", rep)
			}
			checkGroup(t, l, 2, 1, n+1)
		})
	}
}

// TestDamageInTheLastSegment: a damaged frame that good frames follow is
// damage, not a torn tail: only its record is lost (both groups' offsets in
// it), the frames after it stay.
func TestDamageInTheLastSegment(t *testing.T) {
	dir := t.TempDir()
	const n = 2000 // several segments
	buildLog(t, dir, n)
	l := openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
	for i := uint64(n + 1); i <= n+20; i++ {
		appendWait(t, l, []uint64{1, 2}, payload(1, i, 80+int(i%40)))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, last := segFiles(t, dir)
	b := readFile(t, segs[last])
	fr := frames(b)
	var msgs []int
	for _, p := range fr {
		if isMessage(b[p+frameHeader]) {
			msgs = append(msgs, p)
		}
	}
	victim := msgs[len(msgs)/2]
	rec, err := decodeBody(b[victim+frameHeader : frameEndAt(b, victim)])
	if err != nil {
		t.Fatal(err)
	}
	lostOff, _ := rec.offsetOf(2)
	b[victim+frameHeader+7] ^= 0x10
	if err := os.WriteFile(segs[last], b, 0o600); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
	rep := l.Recovery()
	if rep.TornBytes != 0 || rep.Corrupt != 1 || rep.Lost != 2 || len(rep.Damage) != 1 || rep.Damage[0].Pos != int64(victim) {
		t.Fatalf("report %+v", rep)
	}
	got := readAll(t, l, 2, 0)
	if len(got) != n+20-1 {
		t.Fatalf("group 2 holds %d, want %d", len(got), n+20-1)
	}
	for _, e := range got {
		if e.Offset == lostOff || !bytes.Equal(e.Data, payload(1, e.Offset, 80+int(e.Offset%40))) {
			t.Fatalf("offset %d holds %q (lost %d)", e.Offset, e.Data, lostOff)
		}
	}
	if gi, _ := l.Group(2); gi.Lost != 1 || gi.Messages != n+20-1 {
		t.Fatalf("group 2: %+v", gi)
	}
}

func TestCorruptMiddleSegment(t *testing.T) {
	dir := t.TempDir()
	const n = 2000 // several segments
	buildLog(t, dir, n)
	segs, last := segFiles(t, dir)
	if last < 2 {
		t.Fatalf("want several segments, the last with data is %d", last)
	}
	victim := segs[1]
	b := readFile(t, victim)
	fr := frames(b)
	at := fr[len(fr)/2]
	b[at+frameHeader+3] ^= 0xff
	if err := os.WriteFile(victim, b, 0o600); err != nil {
		t.Fatal(err)
	}
	l := openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
	rep := l.Recovery()
	// One record lost (its two offsets, unless group 1's was resolved),
	// not the rest of the segment.
	if rep.Corrupt != 1 || len(rep.Quarantined) != 1 || rep.TornBytes != 0 || rep.Lost == 0 || rep.Lost > 2 {
		t.Fatalf("report %+v", rep)
	}
	if gi, _ := l.Group(2); gi.Messages != n-1 || gi.Lost != 1 {
		t.Fatalf("group 2: %+v", gi)
	}
	q := readFile(t, rep.Quarantined[0])
	if !bytes.Equal(q[:64], b[at:at+64]) {
		t.Fatal("the quarantined bytes are not the bad frame's")
	}
	// Everything outside the damaged part is there, in order; the lost offsets are resolved.
	for g := uint64(1); g <= 2; g++ {
		got := readAll(t, l, g, 0)
		gi, _ := l.Group(g)
		if uint64(len(got)) != gi.Messages || gi.Head != n || got[len(got)-1].Offset != n {
			t.Fatalf("group %d: %d entries, info %+v", g, len(got), gi)
		}
		for _, e := range got {
			if !bytes.Equal(e.Data, payload(1, e.Offset, 80+int(e.Offset%40))) {
				t.Fatalf("group %d: offset %d holds %q", g, e.Offset, e.Data)
			}
		}
	}
	if off := appendOK(t, l, 2, []byte("next")); off != n+1 {
		t.Fatalf("next offset %d", off)
	}
}

// TestRecoveryByteFlips flips random bytes of a log's segments and reopens
// it: recovery must never panic or fail, and what it recovers must be
// consistent and readable.
func TestRecoveryByteFlips(t *testing.T) {
	base := t.TempDir()
	buildLog(t, base, 600)
	seeds := []uint64{*flagFlipSeed}
	if *flagFlipSeed == 0 {
		seeds = seeds[:0]
		start := uint64(time.Now().UnixNano())
		for i := range uint64(12) {
			seeds = append(seeds, start+i)
		}
	}
	t.Logf("seeds %v; replay one with -seglog.flipseed=N", seeds)
	for _, seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, 1))
		dir := t.TempDir()
		copyDir(t, base, dir)
		segs, last := segFiles(t, dir)
		for range 1 + rng.IntN(6) {
			p := segs[rng.IntN(last+1)]
			b := readFile(t, p)
			end := frames(b)
			limit := len(b)
			if len(end) > 0 {
				lf := end[len(end)-1]
				limit = lf + frameHeader + int(binary.LittleEndian.Uint32(b[lf:])) + 16
			}
			i := rng.IntN(min(limit, len(b)))
			b[i] ^= byte(1 + rng.IntN(255))
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("seed %d: panic: %v", seed, r)
				}
			}()
			opts := smallOpts(t, dir)
			opts.Logger = nil
			l, err := Open(opts, map[uint64]GroupState{1: {}, 2: {}})
			if err != nil {
				t.Fatalf("seed %d: Open: %v", seed, err)
			}
			defer l.Close()
			if err := l.checkInvariants(); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			for g := uint64(1); g <= 2; g++ {
				got := readAll(t, l, g, 0)
				for _, e := range got {
					if !bytes.Equal(e.Data, payload(1, e.Offset, 80+int(e.Offset%40))) {
						t.Fatalf("seed %d: group %d offset %d holds %q", seed, g, e.Offset, e.Data)
					}
				}
				appendOK(t, l, g, []byte("after"))
			}
		}()
	}
}

// FuzzRecovery flips bytes of a small log at fuzzed positions and reopens it.
func FuzzRecovery(f *testing.F) {
	f.Add(uint32(10), byte(1), uint32(0), byte(0))
	f.Add(uint32(3), byte(0xff), uint32(70000), byte(7))
	f.Add(uint32(65000), byte(0x80), uint32(200), byte(0x10))
	base := f.TempDir()
	buildLog(f, base, 300)
	f.Fuzz(func(t *testing.T, p1 uint32, x1 byte, p2 uint32, x2 byte) {
		dir := t.TempDir()
		copyDir(t, base, dir)
		segs, _ := segFiles(t, dir)
		for _, fl := range []struct {
			p uint32
			x byte
		}{{p1, x1}, {p2, x2}} {
			path := segs[int(fl.p>>16)%len(segs)]
			b := readFile(t, path)
			b[int(fl.p)%len(b)] ^= fl.x
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		opts := smallOpts(t, dir)
		opts.Logger = nil
		l, err := Open(opts, map[uint64]GroupState{1: {}, 2: {}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		for g := uint64(1); g <= 2; g++ {
			readAll(t, l, g, 0)
		}
	})
}

func copyDir(t testing.TB, from, to string) {
	t.Helper()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == "LOCK" {
			continue
		}
		src, err := os.Open(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		dst, err := os.Create(filepath.Join(to, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(dst, src); err != nil {
			t.Fatal(err)
		}
		src.Close()
		if err := dst.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTornRoll: the first commit into a fresh segment was torn, either
// leaving bytes behind a zero first header or a bad first frame; the log
// before it is intact and appends continue.
func TestTornRoll(t *testing.T) {
	for _, mode := range []string{"no-first-header", "bad-first-frame"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			const n = 400
			buildLog(t, dir, n)
			segs, last := segFiles(t, dir)
			if last != len(segs)-2 {
				t.Fatalf("want a spare after the last segment: %d of %d", last, len(segs))
			}
			spare := segs[len(segs)-1]
			b := readFile(t, spare)
			switch mode {
			case "no-first-header":
				copy(b[5000:], "bytes of a commit whose first page never reached the disk")
			case "bad-first-frame":
				binary.LittleEndian.PutUint32(b, 100)
				copy(b[8:], "a frame whose body never reached the disk")
			}
			if err := os.WriteFile(spare, b, 0o600); err != nil {
				t.Fatal(err)
			}
			l := openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
			rep := l.Recovery()
			if rep.TornBytes <= 0 || rep.Corrupt != 0 {
				t.Fatalf("report %+v", rep)
			}
			checkGroup(t, l, 2, 1, n)
			if off := appendOK(t, l, 2, payload(1, n+1, 80+int((n+1)%40))); off != n+1 {
				t.Fatalf("next offset %d", off)
			}
			l = reopen(t, l, &Snapshot{Groups: map[uint64]GroupState{1: {}, 2: {}}})
			checkGroup(t, l, 2, 1, n+1)
		})
	}
}
