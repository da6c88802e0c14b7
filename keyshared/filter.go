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
type filterSet []glob

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
			if q.pattern == p {
				dup = true
				break
			}
		}
		if !dup {
			fs = append(fs, compileGlob(p))
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
	for i := range fs {
		if fs[i].match(key) {
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
		if fs[i].pattern != o[i].pattern {
			return false
		}
	}
	return true
}

// glob is a compiled key filter: '*' matches any run of characters
// (including none), '?' exactly one character (one UTF-8 rune), every other
// byte itself. The pattern is split at its stars into segments of fixed rune
// length; a key matches when the first segment is its prefix, the last its
// suffix, and the others occur in order in between. Taking each middle
// segment at its leftmost occurrence is enough (it leaves the most room for
// the rest), so matching never backtracks and costs O(len(key)) whatever the
// pattern: segments without '?' are found with strings.Index, segments with
// '?' with a bit-parallel Shift-And over the key's runes (a segment is at
// most MaxFilterLen runes, four 64-bit words).
type glob struct {
	pattern string
	segs    []segment
	star    bool // the pattern holds at least one '*'
}

// segment is a star-free piece of a pattern.
type segment struct {
	text  string
	runes int  // its length in runes, each '?' counting one
	any   bool // holds a '?'
	sa    *shiftAnd
}

func compileGlob(p string) glob {
	g := glob{pattern: p, star: strings.IndexByte(p, '*') >= 0}
	for part := range strings.SplitSeq(p, "*") {
		seg := segment{text: part, runes: utf8.RuneCountInString(part), any: strings.IndexByte(part, '?') >= 0}
		if seg.any && seg.runes <= MaxFilterLen { // longer ones only reach globMatch in tests
			seg.sa = newShiftAnd(part)
		}
		g.segs = append(g.segs, seg)
	}
	return g
}

// saWords bounds a Shift-And pattern: MaxFilterLen runes.
const saWords = (MaxFilterLen + 63) / 64

type saMask [saWords]uint64

// shiftAnd finds a segment with '?' (any one rune) in linear time: bit i of
// the state is set when the last i+1 runes of the key match the segment's
// first i+1 runes.
type shiftAnd struct {
	n       int    // runes in the segment
	any     saMask // positions holding '?'
	ascii   [128]int16
	masks   []saMask // masks[ascii[b]-1] for an ASCII rune b; other runes in wide
	wide    map[rune]saMask
	lastBit saMask // bit n-1
}

func newShiftAnd(seg string) *shiftAnd {
	sa := &shiftAnd{}
	i := 0
	for _, r := range seg {
		w, b := i/64, uint64(1)<<(i%64)
		switch {
		case r == '?':
			sa.any[w] |= b
		case r < 128:
			if sa.ascii[r] == 0 {
				sa.masks = append(sa.masks, saMask{})
				sa.ascii[r] = int16(len(sa.masks))
			}
			sa.masks[sa.ascii[r]-1][w] |= b
		default:
			if sa.wide == nil {
				sa.wide = make(map[rune]saMask)
			}
			m := sa.wide[r]
			m[w] |= b
			sa.wide[r] = m
		}
		i++
	}
	sa.n = i
	sa.lastBit[(i-1)/64] = 1 << ((i - 1) % 64)
	return sa
}

// find returns the byte offsets of the leftmost match of the segment in
// s[from:limit], or -1, -1.
func (sa *shiftAnd) find(s string, from, limit int) (int, int) {
	var d saMask
	// starts[k % n] is the byte offset of the k-th rune scanned, so a match
	// ending at rune k starts at starts[(k-n+1) % n].
	var startsBuf [MaxFilterLen]int
	starts := startsBuf[:sa.n]
	k := 0
	for i := from; i < limit; k++ {
		r, w := utf8.DecodeRuneInString(s[i:limit])
		starts[k%sa.n] = i
		m := sa.any
		if r < 128 {
			if j := sa.ascii[r]; j > 0 {
				for x := range m {
					m[x] |= sa.masks[j-1][x]
				}
			}
		} else if wm, ok := sa.wide[r]; ok {
			for x := range m {
				m[x] |= wm[x]
			}
		}
		carry := uint64(1)
		hit := false
		for x := range d {
			next := d[x] >> 63
			d[x] = (d[x]<<1 | carry) & m[x]
			carry = next
			hit = hit || d[x]&sa.lastBit[x] != 0
		}
		i += w
		if hit {
			return starts[(k-sa.n+1)%sa.n], i
		}
	}
	return -1, -1
}

// at reports where seg ends when it matches s from byte i, or -1.
func (seg *segment) at(s string, i int) int {
	if !seg.any {
		if strings.HasPrefix(s[i:], seg.text) {
			return i + len(seg.text)
		}
		return -1
	}
	t := seg.text
	for len(t) > 0 {
		if i >= len(s) {
			return -1
		}
		if t[0] == '?' {
			_, w := utf8.DecodeRuneInString(s[i:])
			i += w
			t = t[1:]
			continue
		}
		if s[i] != t[0] {
			return -1
		}
		i++
		t = t[1:]
	}
	return i
}

// find returns the leftmost match of seg in s[from:limit] (start and end), or -1.
func (seg *segment) find(s string, from, limit int) (int, int) {
	if !seg.any {
		if j := strings.Index(s[from:limit], seg.text); j >= 0 {
			return from + j, from + j + len(seg.text)
		}
		return -1, -1
	}
	if seg.sa != nil {
		return seg.sa.find(s, from, limit)
	}
	for i := from; i < limit; { // the plain scan, for patterns past MaxFilterLen
		if end := seg.at(s[:limit], i); end >= 0 {
			return i, end
		}
		_, w := utf8.DecodeRuneInString(s[i:limit])
		i += w
	}
	return -1, -1
}

// match reports whether s matches the pattern.
func (g *glob) match(s string) bool {
	first := &g.segs[0]
	if !g.star {
		return first.at(s, 0) == len(s)
	}
	lo := first.at(s, 0)
	if lo < 0 {
		return false
	}
	// The last segment ends the key: it starts runes-of-it before the end.
	last := &g.segs[len(g.segs)-1]
	hi := len(s)
	for n := 0; n < last.runes; n++ {
		if hi <= lo {
			return false
		}
		_, w := utf8.DecodeLastRuneInString(s[lo:hi])
		hi -= w
	}
	if last.at(s, hi) != len(s) {
		return false
	}
	for i := 1; i < len(g.segs)-1; i++ {
		start, end := g.segs[i].find(s, lo, hi)
		if start < 0 {
			return false
		}
		lo = end
	}
	return true
}
