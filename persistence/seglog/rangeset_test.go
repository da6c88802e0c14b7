package seglog

import (
	"math/rand/v2"
	"testing"
)

// TestRangeSet compares rangeSet with a map under random adds, range adds
// and trims.
func TestRangeSet(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		var s rangeSet
		m := map[uint64]bool{}
		floor := uint64(0) // everything <= floor was removed
		for step := range 300 {
			switch p := rng.IntN(10); {
			case p < 6:
				x := floor + 1 + uint64(rng.IntN(200))
				if got := s.add(x); got == m[x] {
					t.Fatalf("seed %d step %d: add(%d) = %v with the offset present: %v", seed, step, x, got, m[x])
				}
				m[x] = true
			case p < 9:
				a := floor + 1 + uint64(rng.IntN(200))
				b := a + uint64(rng.IntN(20))
				s.addRange(a, b)
				for x := a; x <= b; x++ {
					m[x] = true
				}
			default:
				floor += uint64(rng.IntN(30))
				s.removeThrough(floor)
				for x := range m {
					if x <= floor {
						delete(m, x)
					}
				}
			}
			for i, r := range s.r {
				if r.First > r.Last || r.First <= floor || (i > 0 && r.First <= s.r[i-1].Last+1) {
					t.Fatalf("seed %d step %d: bad ranges %v", seed, step, s.r)
				}
			}
			for x := floor; x <= floor+230; x++ {
				if s.contains(x) != m[x] {
					t.Fatalf("seed %d step %d: contains(%d) = %v, want %v (%v)", seed, step, x, s.contains(x), m[x], s.r)
				}
			}
			a := floor + 1 + uint64(rng.IntN(200))
			b := a + uint64(rng.IntN(5))
			want := true
			for x := a; x <= b; x++ {
				want = want && m[x]
			}
			if s.covers(a, b) != want {
				t.Fatalf("seed %d step %d: covers(%d, %d) = %v (%v)", seed, step, a, b, !want, s.r)
			}
		}
	}
}

// removeThrough removes every offset <= c.
func (s *rangeSet) removeThrough(c uint64) {
	i := 0
	for i < len(s.r) && s.r[i].Last <= c {
		i++
	}
	if i > 0 {
		s.r = append(s.r[:0], s.r[i:]...)
	}
	if len(s.r) > 0 && s.r[0].First <= c {
		s.r[0].First = c + 1
	}
}
