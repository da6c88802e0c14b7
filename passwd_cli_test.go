package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/internal/passwd"
)

func passwdCmd(t *testing.T, stdin string, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runPasswd(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String() + errOut.String()
}

func TestPasswdWritesAndDeletes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	if code, out := passwdCmd(t, "first pass\n", path, "dev-1"); code != 1 || !strings.Contains(out, "does not exist (-c creates it)") {
		t.Fatalf("without -c on a missing file: %d %q", code, out)
	}
	if code, out := passwdCmd(t, "first pass\r\n", "-c", path, "dev-1"); code != 0 {
		t.Fatalf("-c: %d %q", code, out)
	}
	if code, out := passwdCmd(t, "second", path, "dev-2"); code != 0 { // no newline: the end of stdin ends it
		t.Fatalf("add: %d %q", code, out)
	}
	if code, out := passwdCmd(t, "changed\n", path, "dev-1"); code != 0 {
		t.Fatalf("change: %d %q", code, out)
	}
	f, err := passwd.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Entries) != 2 || f.Entries[0].User != "dev-1" || f.Entries[1].User != "dev-2" {
		t.Fatalf("entries %+v", f.Entries)
	}
	if h := f.Entries[0].Hash; h.Scheme() != passwd.Argon2id || !h.Verify([]byte("changed")) || h.Verify([]byte("first pass")) {
		t.Fatal("dev-1's password is not the new one")
	}
	if !f.Entries[1].Hash.Verify([]byte("second")) {
		t.Fatal("dev-2's password does not verify")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
	if code, out := passwdCmd(t, "", "-D", path, "dev-1"); code != 0 {
		t.Fatalf("-D: %d %q", code, out)
	}
	if f, _ = passwd.ReadFile(path); len(f.Entries) != 1 || f.Entries[0].User != "dev-2" {
		t.Fatalf("after -D: %+v", f.Entries)
	}
	for _, c := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"\n", []string{path, "dev-3"}, 1, "empty password on stdin"},
		{"x\n", []string{path}, 2, "want FILE USER"},
		{"x\n", []string{"--hash", "md5", path, "u"}, 2, `unknown hash "md5"`},
		{"x\n", []string{path, "a:b"}, 2, "holds ':'"},
		{"", []string{"-D", path, "nobody"}, 1, `no such user "nobody"`},
		{"", []string{"-c", "-D", path, "dev-2"}, 2, "do not go together"},
		{strings.Repeat("x", maxPasswordInput+1), []string{path, "dev-3"}, 1, "longer than"},
	} {
		if code, out := passwdCmd(t, c.stdin, c.args...); code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("passwd %q: %d %q, want %d and %q", c.args, code, out, c.code, c.want)
		}
	}
	if f, _ = passwd.ReadFile(path); len(f.Entries) != 1 {
		t.Fatalf("a refused command changed the file: %+v", f.Entries)
	}
}
