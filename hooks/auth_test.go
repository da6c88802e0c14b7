package hooks

import "testing"

func TestSplitShared(t *testing.T) {
	for _, tc := range []struct {
		in            string
		group, filter string
		ok            bool
	}{
		{"$share/workers/orders/#", "workers", "orders/#", true},
		{"$SHARE/w/a", "w", "a", true},
		{"$share/w/+/x", "w", "+/x", true},
		{"$share//a", "", "", false},    // empty share name
		{"$share/w/", "", "", false},    // empty filter
		{"$share/w", "", "", false},     // no filter
		{"$share/w+x/a", "", "", false}, // wildcard in the share name
		{"$share/w#/a", "", "", false},  // wildcard in the share name
		{"orders/#", "", "", false},     // not shared
		{"$sharex/w/a", "", "", false},  // not the prefix
		{"$share", "", "", false},       // prefix alone
		{"$queue/w/a", "", "", false},   // another broker's syntax
	} {
		g, f, ok := SplitShared(tc.in)
		if ok != tc.ok || g != tc.group || f != tc.filter {
			t.Errorf("SplitShared(%q) = %q, %q, %v; want %q, %q, %v", tc.in, g, f, ok, tc.group, tc.filter, tc.ok)
		}
	}
}
