package filter

import "testing"

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		filter, topic string
		want          bool
	}{
		{"#", "a/b", true}, {"a/#", "a", true}, {"a/#", "a/b/c", true}, {"a/#", "ab", false},
		{"a/+", "a/b", true}, {"a/+", "a/b/c", false}, {"a/+", "a/", true}, {"+/+", "/x", true},
		{"a/b", "a/b", true}, {"a/b", "a/c", false}, {"a", "a/b", false},
		{"#", "$SYS/x", false}, {"+/x", "$SYS/x", false}, {"$SYS/#", "$SYS/x", true},
		{"site/+/t", "site/7/t", true}, {"site/+/t", "site//t", true},
	} {
		if got := Match(tc.filter, tc.topic); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.filter, tc.topic, got, tc.want)
		}
	}
}
