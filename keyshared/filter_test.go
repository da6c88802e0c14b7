package keyshared

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// globRef is the reference matcher: the plain recursive definition, on
// runes, memoised so that fuzz inputs full of '*' stay fast.
func globRef(pattern, s string) bool {
	p, r := []rune(pattern), []rune(s)
	memo := make(map[[2]int]bool)
	var match func(i, j int) bool
	match = func(i, j int) bool {
		k := [2]int{i, j}
		if v, ok := memo[k]; ok {
			return v
		}
		var v bool
		switch {
		case i == len(p):
			v = j == len(r)
		case p[i] == '*':
			v = match(i+1, j) || (j < len(r) && match(i, j+1))
		case j == len(r):
			v = false
		case p[i] == '?':
			v = match(i+1, j+1)
		default:
			v = p[i] == r[j] && match(i+1, j+1)
		}
		memo[k] = v
		return v
	}
	return match(0, 0)
}

func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"payment", "payment", true},
		{"payment", "payments", false},
		{"ship*", "shipping", true},
		{"ship*", "ship", true},
		{"ship*", "shi", false},
		{"eu-west-?", "eu-west-1", true},
		{"eu-west-?", "eu-west-12", false},
		{"eu-west-?", "eu-west-", false},
		{"*", "", true},
		{"*", "anything", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "abcbc", true},
		{"a*b*c", "acb", false},
		{"*ab", "aab", true},
		{"*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false},
		{"?", "é", true},
		{"??", "é", false},
		{"k?y", "k€y", true},
		{"*€", "x€", true},
	} {
		if got := globMatch(c.p, c.s); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", c.p, c.s, got, c.want)
		}
		if ref := globRef(c.p, c.s); ref != c.want {
			t.Errorf("reference(%q, %q) = %v, want %v", c.p, c.s, ref, c.want)
		}
	}
}

func TestCompileFilters(t *testing.T) {
	for _, bad := range [][]string{
		{""},
		{"ok", ""},
		{strings.Repeat("a", MaxFilterLen+1)},
		{"\xff"},
		{"a\x00b"},
		make([]string, MaxFilters+1),
	} {
		if _, err := compileFilters(bad); !errors.Is(err, ErrInvalidFilter) {
			t.Errorf("%q: error %v, want ErrInvalidFilter", bad, err)
		}
	}
	if fs, err := compileFilters([]string{"a*", "**", "b"}); err != nil || fs != nil {
		t.Errorf("a pattern of stars must mean every key: %v %v", fs, err)
	}
	if fs, err := compileFilters([]string{"a*", "b?", "a*"}); err != nil || !slices.Equal(fs.patterns(), []string{"a*", "b?"}) {
		t.Errorf("duplicates: %v %v", fs, err)
	}
	if fs, err := compileFilters(nil); err != nil || !fs.match("x") {
		t.Errorf("no filters must match every key: %v", err)
	}
}

func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{{"ship*", "shipping"}, {"eu-west-?", "eu-west-1"}, {"*a*?b", "xaayb"}, {"?*?", "é"}, {"**", ""}, {"a\xffb", "a\xffb"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		got := globMatch(pattern, s) // must not panic on any input
		if !utf8.ValidString(pattern) || !utf8.ValidString(s) || len(pattern) > 64 || len(s) > 128 {
			return
		}
		if want := globRef(pattern, s); got != want {
			t.Fatalf("globMatch(%q, %q) = %v, reference %v", pattern, s, got, want)
		}
	})
}

// FuzzKeyFilters feeds arbitrary keys and filter patterns through
// compileFilters and the ring: invalid patterns must be refused with
// ErrInvalidFilter, valid ones must route a key to the member exactly when
// the reference matcher says a pattern matches it.
func FuzzKeyFilters(f *testing.F) {
	f.Add("eu-west-1", "eu-*", "")
	f.Add("payment", "payment", "ship*")
	f.Add("", "*", "?")
	f.Add("k\x00", "k\x00", "k?")
	f.Add("é", "?", "\xff")
	f.Fuzz(func(t *testing.T, key, p1, p2 string) {
		pats := []string{p1, p2}
		fs, err := compileFilters(pats)
		valid := ValidateFilter(p1) == nil && ValidateFilter(p2) == nil
		if !valid {
			if !errors.Is(err, ErrInvalidFilter) {
				t.Fatalf("patterns %q: error %v, want ErrInvalidFilter", pats, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid patterns %q: %v", pats, err)
		}
		r := buildRing([]ringMember{{id: "m", filters: fs}})
		got := r.pick(key) == 0
		if !utf8.ValidString(key) || len(key) > 128 {
			return
		}
		want := globRef(p1, key) || globRef(p2, key)
		if got != want {
			t.Fatalf("key %q, patterns %q: routed %v, reference %v", key, pats, got, want)
		}
	})
}

// BenchmarkGlobWorstCase: a 1 KiB key against 256-byte patterns built to
// make a matcher work hardest: many stars (quadratic for backtracking
// matchers), and a '?' segment that almost matches at every position (the
// bound of O(len(key) x len(segment)) for such segments).
func BenchmarkGlobWorstCase(b *testing.B) {
	key := strings.Repeat("a", 1023) + "b"
	for name, pattern := range map[string]string{
		"stars":       strings.Repeat("*a", 126) + "*c*b",
		"question":    "*" + strings.Repeat("a", 250) + "?c*b",
		"literal-254": "*" + strings.Repeat("a", 252) + "c*",
	} {
		g := compileGlob(pattern)
		if g.match(key) != globRef(pattern, key) {
			b.Fatalf("%s: disagrees with the reference", name)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				g.match(key)
			}
		})
	}
}
