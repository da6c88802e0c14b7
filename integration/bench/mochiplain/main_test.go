package main

import (
	"os"
	"strings"
	"testing"
)

// TestSameMochiAsKeyline keeps the baseline honest: plain mochi is built
// from this module (integration/bench), Keyline from the repository root,
// and the benchmark compares the two as "the mochi Keyline builds on".
func TestSameMochiAsKeyline(t *testing.T) {
	const mod = "github.com/mochi-mqtt/server/v2"
	keyline, bench := requiredVersion(t, "../../../go.mod", mod), requiredVersion(t, "../go.mod", mod)
	if keyline != bench {
		t.Errorf("Keyline requires %s %s, integration/bench requires %s: run `go get %s@%s` in integration/bench",
			mod, keyline, bench, mod, keyline)
	}
}

// requiredVersion returns the version go.mod at path requires of module.
func requiredVersion(t *testing.T, path, module string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	t.Fatalf("%s does not require %s", path, module)
	return ""
}
