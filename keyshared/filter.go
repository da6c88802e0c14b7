package keyshared

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxFilterLen is the longest key filter pattern accepted, in bytes.
const MaxFilterLen = 256

// MaxFilters is the most key filters one member may declare.
const MaxFilters = 64

// filterSet is the compiled key filter list of one member. An empty set
// matches every key (a member without filters takes any key).
type filterSet []string

// compileFilters validates patterns and returns them as a filterSet. A pattern
// made only of '*' matches everything, so a list containing one collapses to
// the empty set, which keeps such a member on the ring's allocation-free path.
// Duplicates are removed; order is kept otherwise.
func compileFilters(patterns []string) (filterSet, error) {
	if len(patterns) > MaxFilters {
		return nil, fmt.Errorf("%w: %d filters, at most %d", ErrInvalidFilter, len(patterns), MaxFilters)
	}
	for _, p := range patterns {
		if err := ValidateFilter(p); err != nil {
			return nil, err
		}
	}
	var fs filterSet
	for _, p := range patterns {
		if strings.Trim(p, "*") == "" {
			return nil, nil
		}
		dup := false
		for _, q := range fs {
			if q == p {
				dup = true
				break
			}
		}
		if !dup {
			fs = append(fs, p)
		}
	}
	return fs, nil
}

// ValidateFilter reports whether pattern is a usable key filter: non-empty,
// at most MaxFilterLen bytes, valid UTF-8 without NUL (as MQTT requires of
// its strings). The error wraps ErrInvalidFilter.
func ValidateFilter(pattern string) error {
	switch {
	case pattern == "":
		return fmt.Errorf("%w: empty pattern", ErrInvalidFilter)
	case len(pattern) > MaxFilterLen:
		return fmt.Errorf("%w: pattern of %d bytes, at most %d", ErrInvalidFilter, len(pattern), MaxFilterLen)
	case !utf8.ValidString(pattern):
		return fmt.Errorf("%w: pattern %q is not valid UTF-8", ErrInvalidFilter, pattern)
	case strings.IndexByte(pattern, 0) >= 0:
		return fmt.Errorf("%w: pattern %q contains NUL", ErrInvalidFilter, pattern)
	}
	return nil
}

// match reports whether key matches any filter of the set; the empty set
// matches every key.
func (fs filterSet) match(key string) bool {
	if len(fs) == 0 {
		return true
	}
	for _, p := range fs {
		if globMatch(p, key) {
			return true
		}
	}
	return false
}

func (fs filterSet) equal(o filterSet) bool {
	if len(fs) != len(o) {
		return false
	}
	for i := range fs {
		if fs[i] != o[i] {
			return false
		}
	}
	return true
}

// globMatch reports whether s matches pattern, where '*' matches any run of
// characters (including none), '?' exactly one character (one UTF-8 rune) and
// every other byte itself. It is iterative: on a mismatch it backtracks only
// to the last '*', which is enough for this glob dialect and bounds the work
// by len(pattern)*len(s). It never allocates.
func globMatch(pattern, s string) bool {
	px, sx := 0, 0
	starP, starS := -1, 0
	for sx < len(s) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starP, starS = px, sx
				px++
				continue
			case '?':
				_, w := utf8.DecodeRuneInString(s[sx:])
				px++
				sx += w
				continue
			default:
				if s[sx] == c {
					px++
					sx++
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		// Let the last star swallow one more character and retry after it.
		_, w := utf8.DecodeRuneInString(s[starS:])
		starS += w
		px, sx = starP+1, starS
	}
	for px < len(pattern) && pattern[px] == '*' {
		px++
	}
	return px == len(pattern)
}
