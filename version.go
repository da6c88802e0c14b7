package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// versionLine is what `keyline --version` prints: the version, the commit it
// was built from and when, and the Go toolchain and platform. Values set at
// link time win; otherwise the build information the Go toolchain embeds
// (vcs.revision, vcs.time, vcs.modified) fills them in, so a `go build` in a
// git checkout still names its commit.
func versionLine() string {
	v, c, d := version, commit, buildDate
	dirty := false
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if c == "" {
					c = s.Value
				}
			case "vcs.time":
				if d == "" {
					d = s.Value
				}
			case "vcs.modified":
				dirty = s.Value == "true" && commit == ""
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if c == "" {
		c = "unknown"
	} else if len(c) > 12 {
		c = c[:12]
	}
	if dirty {
		c += "-dirty"
	}
	if d == "" {
		d = "unknown"
	}
	return fmt.Sprintf("keyline %s (commit %s, built %s, %s %s/%s)", v, c, d, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
