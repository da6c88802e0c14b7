package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackupAndRestoreCommandLines: the usage mistakes exit 2, a backup
// directory that is not one exits 1, each with one line naming the problem.
func TestBackupAndRestoreCommandLines(t *testing.T) {
	empty := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"backup"}, 2, "--to DIR is required"},
		{[]string{"backup", "--to", t.TempDir(), "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"backup", "--to", filepath.Join(t.TempDir(), "b"), "--server", "ftp://x"}, 2, "not an http(s) URL"},
		{[]string{"restore"}, 2, "--from DIR is required"},
		{[]string{"restore", "--from", empty, "--data-dir", filepath.Join(t.TempDir(), "d")}, 1, "has no MANIFEST.json: the backup did not finish"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		msg := errb.String()
		if code != c.code || !strings.Contains(msg, c.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("keyline %s: exit %d, stderr %q; want exit %d and one line with %q", strings.Join(c.args, " "), code, msg, c.code, c.want)
		}
	}
}
