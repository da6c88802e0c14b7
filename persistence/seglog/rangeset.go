package seglog

import "sort"

// rangeSet is a set of offsets as sorted, disjoint, non-adjacent ranges.
// Adding at or next to the end is O(1) (acks arrive almost in order); other
// changes are O(log n) to find and O(n) to insert.
type rangeSet struct {
	r []Range
}

func (s *rangeSet) len() int { return len(s.r) }

// count returns the number of offsets in the set.
func (s *rangeSet) count() uint64 {
	var n uint64
	for _, r := range s.r {
		n += r.Last - r.First + 1
	}
	return n
}

func (s *rangeSet) empty() bool  { return len(s.r) == 0 }
func (s *rangeSet) reset()       { s.r = s.r[:0] }
func (s *rangeSet) first() Range { return s.r[0] }

// ranges returns a copy of the ranges.
func (s *rangeSet) ranges() []Range {
	if len(s.r) == 0 {
		return nil
	}
	return append([]Range(nil), s.r...)
}

// find returns the index of the first range whose Last >= x.
func (s *rangeSet) find(x uint64) int {
	n := len(s.r)
	if n == 0 || s.r[n-1].Last < x {
		return n
	}
	return sort.Search(n, func(i int) bool { return s.r[i].Last >= x })
}

// contains reports whether x is in the set.
func (s *rangeSet) contains(x uint64) bool {
	i := s.find(x)
	return i < len(s.r) && s.r[i].First <= x
}

// covers reports whether every offset of a..b (a <= b) is in the set.
func (s *rangeSet) covers(a, b uint64) bool {
	i := s.find(a)
	return i < len(s.r) && s.r[i].First <= a && s.r[i].Last >= b
}

// add adds x and reports whether it was absent.
func (s *rangeSet) add(x uint64) bool {
	n := len(s.r)
	if n > 0 {
		last := &s.r[n-1]
		switch {
		case x == last.Last+1:
			last.Last = x
			return true
		case x > last.Last+1:
			s.r = append(s.r, Range{x, x})
			return true
		}
	} else {
		s.r = append(s.r, Range{x, x})
		return true
	}
	i := s.find(x)
	cur := &s.r[i]
	if cur.First <= x {
		return false
	}
	joinPrev := i > 0 && s.r[i-1].Last+1 == x
	joinNext := cur.First == x+1
	switch {
	case joinPrev && joinNext:
		s.r[i-1].Last = cur.Last
		s.r = append(s.r[:i], s.r[i+1:]...)
	case joinPrev:
		s.r[i-1].Last = x
	case joinNext:
		cur.First = x
	default:
		s.r = append(s.r, Range{})
		copy(s.r[i+1:], s.r[i:])
		s.r[i] = Range{x, x}
	}
	return true
}

// addRange adds a..b (a <= b).
func (s *rangeSet) addRange(a, b uint64) {
	n := len(s.r)
	if n == 0 || a > s.r[n-1].Last+1 {
		s.r = append(s.r, Range{a, b})
		return
	}
	// First range that ends at or after a-1 (could merge), last that starts at or before b+1.
	i := s.find(a - 1)
	if a == 0 {
		i = 0
	}
	j := i
	for j < len(s.r) && s.r[j].First <= b+1 {
		j++
	}
	if i == j {
		s.r = append(s.r, Range{})
		copy(s.r[i+1:], s.r[i:])
		s.r[i] = Range{a, b}
		return
	}
	merged := Range{min(a, s.r[i].First), max(b, s.r[j-1].Last)}
	s.r[i] = merged
	s.r = append(s.r[:i+1], s.r[j:]...)
}

// popFrontIf removes and returns the first range if it starts at x.
func (s *rangeSet) popFrontIf(x uint64) (Range, bool) {
	if len(s.r) == 0 || s.r[0].First != x {
		return Range{}, false
	}
	r := s.r[0]
	s.r = append(s.r[:0], s.r[1:]...)
	return r, true
}
