package persistence

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dirContents returns every file under dir with its contents, but for the
// spare segment an open log prepares in the background (a .seg.tmp file,
// renamed when ready: it may go between the listing and the read).
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, ".seg.tmp") {
			return err
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil // renamed meanwhile
		}
		out[strings.TrimPrefix(p, dir)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRefusesWithoutItsDatabaseFile is issue 23's item 20: a data dir whose
// keyline.db is missing beside segments that hold records, or empty beside
// anything, must not start empty (the segment log would take every record
// for garbage and delete it); the error names the file, and nothing changes.
func TestRefusesWithoutItsDatabaseFile(t *testing.T) {
	build := func(t *testing.T) string {
		dir := t.TempDir()
		db, err := Open(dir, Options{NoSync: true, SegmentSize: 64 << 10, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ensure(t, db.Groups(), "g/#", GroupConfig{})
		for i := range 200 {
			mustAppend(t, db.Groups(), "g/#", fullMsg(i))
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tc := range []struct {
		name   string
		damage func(path string) error
		want   error
	}{
		{"missing", os.Remove, ErrMissingFile},
		{"empty", func(p string) error { return os.Truncate(p, 0) }, ErrEmptyFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := build(t)
			path := filepath.Join(dir, FileName)
			if err := tc.damage(path); err != nil {
				t.Fatal(err)
			}
			before := dirContents(t, dir)
			db, err := Open(dir, Options{Logger: testLogger(t)})
			if err == nil {
				db.Close()
				t.Fatal("opened a data dir without its database file")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Open = %v, want one line of %v naming %s", err, tc.want, path)
			}
			t.Logf("Open: %v", err)
			after := dirContents(t, dir)
			delete(after, "/segments/LOCK")
			delete(before, "/segments/LOCK")
			if len(after) != len(before) {
				t.Fatalf("files before %d, after %d", len(before), len(after))
			}
			for name, b := range before {
				if after[name] != b {
					t.Fatalf("%s changed", name)
				}
			}
		})
	}
	t.Run("fresh", func(t *testing.T) {
		// An empty file alone (a first start that crashed as bbolt created
		// it) and segments without records start afresh.
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, FileName), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		openTestDB(t, dir, Options{NoSync: true}).Close()
		if err := os.Remove(filepath.Join(dir, FileName)); err != nil {
			t.Fatal(err)
		}
		openTestDB(t, dir, Options{NoSync: true})
	})
}
