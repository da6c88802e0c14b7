package persistence

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestBackupWhileServing takes a backup while publishers append to two
// groups and a consumer resolves what they appended, with small segments so
// that segments roll and are deleted during it. The restored data dir must
// hold every message appended before the backup began that was not
// resolved before it began, and nothing resolved before it began.
func TestBackupWhileServing(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir, Options{NoSync: true, SegmentSize: 64 << 10})
	groups := db.Groups()
	names := []string{"g/a/#", "g/b/#"}
	for _, n := range names {
		if _, err := groups.EnsureGroup(n, GroupConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	logs := map[string]interface {
		Resolve([]uint64)
		Head() uint64
	}{}
	for _, n := range names {
		l, err := groups.Log(n)
		if err != nil {
			t.Fatal(err)
		}
		logs[n] = l
	}

	// Before the backup: 600 messages in each group, the first 500 resolved.
	payload := strings.Repeat("x", 200)
	for i := 1; i <= 600; i++ {
		for _, r := range groups.AppendMulti(names, msg(fmt.Sprintf("t/%d", i%7), payload)) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	for _, n := range names {
		offs := make([]uint64, 500)
		for i := range offs {
			offs[i] = uint64(i + 1)
		}
		logs[n].Resolve(offs)
	}
	if err := groups.Flush(); err != nil {
		t.Fatal(err)
	}

	// During it: appends and resolves go on until the backup is done.
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 601; !stop.Load(); i++ {
			for _, r := range groups.AppendMulti(names, msg("t/late", payload)) {
				if r.Err != nil {
					select {
					case errc <- r.Err:
					default:
					}
					return
				}
			}
			if i%10 == 0 {
				for _, n := range names {
					logs[n].Resolve([]uint64{uint64(i - 5)})
				}
			}
		}
	}()
	var buf bytes.Buffer
	m, st, err := db.Backup(&buf)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	t.Logf("backup: %d files, %d bytes, snapshot transaction %v, total %v", len(m.Files), st.Bytes, st.SnapshotTime, st.Total)
	if len(m.Files) < 2 || m.Files[0].Name != FileName {
		t.Fatalf("manifest lists %v", m.Files)
	}

	// Extract, restore, open: every message appended before the backup and
	// not resolved before it is there, in order.
	bdir := filepath.Join(t.TempDir(), "backup")
	if _, err := ExtractBackup(&buf, bdir); err != nil {
		t.Fatal(err)
	}
	rdir := filepath.Join(t.TempDir(), "restored")
	if _, err := Restore(bdir, rdir); err != nil {
		t.Fatal(err)
	}
	rdb := openTestDB(t, rdir, Options{NoSync: true, SegmentSize: 64 << 10})
	for _, n := range names {
		l, err := rdb.Groups().Log(n)
		if err != nil {
			t.Fatal(err)
		}
		cursor, err := l.LoadCursor()
		if err != nil {
			t.Fatal(err)
		}
		if cursor > 500 {
			// Resolutions after the backup began may be in it, but not
			// past offset 600's neighbourhood without the messages.
			t.Logf("%s: cursor %d", n, cursor)
		}
		got, err := l.ReadFrom(1, 200, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := uint64(501)
		for _, e := range got {
			if e.Offset > 600 {
				break
			}
			if e.Offset != want {
				t.Fatalf("%s: restored log has offset %d where %d was expected (offsets 501-600 were unresolved before the backup)", n, e.Offset, want)
			}
			want++
		}
		if want != 601 {
			t.Fatalf("%s: restored log has offsets 501..%d of 501..600", n, want-1)
		}
		if l.Head() < 600 {
			t.Fatalf("%s: restored head %d < 600", n, l.Head())
		}
	}
}

// TestRestoreRefusesBadBackups: a backup that did not finish (no manifest),
// one with a damaged or missing file, one with a file too many, and a data
// dir that is not empty are each refused with a line naming the problem,
// and nothing is left in the data dir.
func TestRestoreRefusesBadBackups(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir, Options{NoSync: true, SegmentSize: 64 << 10})
	if _, err := db.Groups().EnsureGroup("g/t", GroupConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Groups().Append("g/t", msg("t", "hello")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	m, _, err := db.Backup(&buf)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(t.TempDir(), "good")
	if _, err := ExtractBackup(bytes.NewReader(buf.Bytes()), good); err != nil {
		t.Fatal(err)
	}
	copyDir := func(t *testing.T) string {
		d := filepath.Join(t.TempDir(), "b")
		if _, err := ExtractBackup(bytes.NewReader(buf.Bytes()), d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	seg := m.Files[len(m.Files)-1].Name
	cases := []struct {
		name, want string
		damage     func(t *testing.T, d string)
	}{
		{"partial", "did not finish", func(t *testing.T, d string) { os.Remove(filepath.Join(d, ManifestName)) }},
		{"flipped byte", "does not match its checksum", func(t *testing.T, d string) {
			p := filepath.Join(d, seg)
			b, _ := os.ReadFile(p)
			b[100] ^= 1
			os.WriteFile(p, b, 0o600)
		}},
		{"missing file", "is missing", func(t *testing.T, d string) { os.Remove(filepath.Join(d, FileName)) }},
		{"truncated file", "bytes, the manifest says", func(t *testing.T, d string) { os.Truncate(filepath.Join(d, seg), 1000) }},
		{"extra file", "is not in the manifest", func(t *testing.T, d string) {
			os.WriteFile(filepath.Join(d, "segments", "00000000000000000099.seg"), []byte("x"), 0o600)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := copyDir(t)
			c.damage(t, d)
			target := filepath.Join(t.TempDir(), "data")
			_, err := Restore(d, target)
			if !errors.Is(err, ErrBadBackup) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Restore: %v, want one line with %q", err, c.want)
			}
			if ents, _ := os.ReadDir(target); len(ents) != 0 {
				t.Fatalf("a refused restore left %d entries in the data dir", len(ents))
			}
		})
	}
	t.Run("data dir not empty", func(t *testing.T) {
		if _, err := Restore(good, dir); err == nil || !strings.Contains(err.Error(), "is not empty") {
			t.Fatalf("Restore into a used data dir: %v", err)
		}
	})
	t.Run("stream cut short", func(t *testing.T) {
		cut := buf.Bytes()[:buf.Len()/2]
		if _, err := ExtractBackup(bytes.NewReader(cut), filepath.Join(t.TempDir(), "cut")); !errors.Is(err, ErrBadBackup) {
			t.Fatalf("ExtractBackup of half a stream: %v", err)
		}
	})
}
