package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// checkDataDir writes a data dir with one group of 3,000 messages over
// several 64 KiB segments, and returns it with its segment files.
func checkDataDir(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	db, err := persistence.Open(dir, persistence.Options{NoSync: true, SegmentSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	s := db.Groups()
	if _, err := s.EnsureGroup("w/orders/#", keyshared.GroupConfig{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3000 {
		m := keyshared.Message{Topic: "orders/1", Key: fmt.Sprint(i % 7), QoS: 1, Payload: []byte(strings.Repeat("p", 60))}
		if _, err := s.Append("w/orders/#", m); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := filepath.Glob(filepath.Join(dir, "segments", "*.seg"))
	if err != nil || len(segs) < 4 {
		t.Fatalf("segments %v, %v", segs, err)
	}
	return dir, segs
}

// TestCheck is issue 29's item 2: `keyline check` reads a stopped broker's
// data dir without changing it, names each kind of damage the audit made
// (a flipped byte, a truncated segment, a missing keyline.db) and exits 1;
// a sound data dir exits 0.
func TestCheck(t *testing.T) {
	dir, _ := checkDataDir(t)
	code, out, stderr := keyline(t, "check", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "no damage found") || !strings.Contains(out, "w/orders/#  3000  0       3000") || stderr != "" {
		t.Fatalf("sound data dir: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("sound:\n%s", out)

	damage := []struct {
		name   string
		damage func(t *testing.T, dir string, segs []string) (want []string)
	}{
		{"flipped byte", func(t *testing.T, dir string, segs []string) []string {
			b, err := os.ReadFile(segs[1])
			if err != nil {
				t.Fatal(err)
			}
			b[20000] ^= 0x04
			if err := os.WriteFile(segs[1], b, 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{segs[1] + ": ", "bad frame", `group "w/orders/#": 1 unresolved messages are damaged`}
		}},
		{"truncated segment", func(t *testing.T, dir string, segs []string) []string {
			if err := os.Truncate(segs[1], 30000); err != nil {
				t.Fatal(err)
			}
			return []string{segs[1] + ": 0 bytes at 30000: truncated: the file has 30000 bytes, its header says 65536", "unresolved messages are damaged or missing"}
		}},
		{"missing keyline.db", func(t *testing.T, dir string, segs []string) []string {
			if err := os.Remove(filepath.Join(dir, "keyline.db")); err != nil {
				t.Fatal(err)
			}
			return []string{"database file is missing: " + filepath.Join(dir, "keyline.db")}
		}},
		{"garbled keyline.db", func(t *testing.T, dir string, segs []string) []string {
			p := filepath.Join(dir, "keyline.db")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for i := 2 * 4096; i < len(b); i++ { // every page past the meta pages
				b[i] = byte(i*7) ^ 0xa5
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{p + ": "}
		}},
	}
	for _, tc := range damage {
		t.Run(tc.name, func(t *testing.T) {
			dir, segs := checkDataDir(t)
			want := tc.damage(t, dir, segs)
			before := snapshot(t, dir)
			code, out, stderr := keyline(t, "check", "--data-dir", dir)
			if code != 1 || !strings.Contains(out, "damage:") || !strings.HasPrefix(stderr, "keyline: check: ") || strings.Count(stderr, "\n") != 1 {
				t.Fatalf("exit %d\n%s%s", code, out, stderr)
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("report does not say %q:\n%s", w, out)
				}
			}
			t.Logf("%s", out)
			if after := snapshot(t, dir); after != before {
				t.Fatal("the check changed the data dir")
			}
		})
	}

	t.Run("usage", func(t *testing.T) {
		code, _, stderr := keyline(t, "check", "--no-such")
		wantFail(t, code, stderr, 2, "unknown flag: --no-such")
		code, _, stderr = keyline(t, "check", "--data-dir", filepath.Join(dir, "nope"))
		wantFail(t, code, stderr, 1, "nope")
	})
}

// snapshot returns every file of dir with its contents, as one string.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %x\n", p, data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
