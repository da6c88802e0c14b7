package main

import (
	"bytes"
	"regexp"
	"testing"
)

// TestVersionNamesCommitAndDate checks what `keyline --version` prints when
// dist/release.sh set the version, commit and date at link time, and that a
// plain build still prints one well-formed line.
func TestVersionNamesCommitAndDate(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--version"}, &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	shape := regexp.MustCompile(`^keyline \S+ \(commit \S+, built \S+, go\S+ \w+/\w+\)\n$`)
	if !shape.MatchString(out.String()) {
		t.Fatalf("plain build: %q", out.String())
	}

	defer func(v, c, d string) { version, commit, buildDate = v, c, d }(version, commit, buildDate)
	version, commit, buildDate = "v1.4.0", "0123456789abcdef0123", "2026-12-01T10:00:00Z"
	got := versionLine()
	want := regexp.MustCompile(`^keyline v1\.4\.0 \(commit 0123456789ab, built 2026-12-01T10:00:00Z, go\S+ \w+/\w+\)$`)
	if !want.MatchString(got) {
		t.Fatalf("release build: %q", got)
	}
}
