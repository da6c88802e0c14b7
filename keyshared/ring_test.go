package keyshared

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func ringOf(n int) *ring {
	ms := make([]ringMember, n)
	for i := range ms {
		ms[i] = ringMember{id: fmt.Sprintf("client-%d", i)}
	}
	return buildRing(ms)
}

func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("device/%d", i)
	}
	return keys
}

// TestRingDistributionAndRemap prints, over 100,000 keys, the max/mean keys
// per member for N = 2..32 and the fraction of keys remapped going from N to
// N+1 members for N = 2..16, and bounds both. It also checks that a join
// moves keys only onto the new member.
func TestRingDistributionAndRemap(t *testing.T) {
	keys := testKeys(100_000)
	owners := func(r *ring) []int32 {
		o := make([]int32, len(keys))
		for i, k := range keys {
			o[i] = int32(r.pick(k))
		}
		return o
	}
	t.Log("  N  max/mean  min/mean")
	worst := 0.0
	for n := 2; n <= 32; n++ {
		counts := make([]int, n)
		for _, o := range owners(ringOf(n)) {
			counts[o]++
		}
		mean := float64(len(keys)) / float64(n)
		lo, hi := len(keys), 0
		for _, c := range counts {
			lo, hi = min(lo, c), max(hi, c)
		}
		t.Logf("%3d  %8.3f  %8.3f", n, float64(hi)/mean, float64(lo)/mean)
		worst = max(worst, float64(hi)/mean)
		if float64(hi)/mean > 1.4 || float64(lo)/mean < 0.6 {
			t.Errorf("N=%d: keys per member between %.2f and %.2f of the mean", n, float64(lo)/mean, float64(hi)/mean)
		}
	}
	t.Logf("worst max/mean %.3f", worst)
	t.Log("  N->N+1  remapped  1/(N+1)  ratio")
	for n := 2; n <= 16; n++ {
		before, after := ringOf(n), ringOf(n+1)
		ob, oa := owners(before), owners(after)
		newID := fmt.Sprintf("client-%d", n)
		moved := 0
		for i := range keys {
			idB, idA := before.members[ob[i]].id, after.members[oa[i]].id
			if idB != idA {
				moved++
				if idA != newID {
					t.Fatalf("N=%d: key %q moved from %s to %s, not to the new member", n, keys[i], idB, idA)
				}
			}
		}
		frac, ideal := float64(moved)/float64(len(keys)), 1/float64(n+1)
		t.Logf("%3d->%-3d  %8.4f  %7.4f  %5.2f", n, n+1, frac, ideal, frac/ideal)
		if frac < 0.5*ideal || frac > 1.5*ideal {
			t.Errorf("N=%d->%d: remapped %.4f, want within 0.5x..1.5x of %.4f", n, n+1, frac, ideal)
		}
	}
}

func TestRingIgnoresInsertionOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ms := []ringMember{{id: "a"}, {id: "b", filters: fset("k1*")}, {id: "c"}, {id: "member-42"}, {id: "x", filters: fset("?2*", "k3")}}
	ref := buildRing(ms)
	keys := testKeys(5000)
	keys = append(keys, "k1", "k10", "k3", "a2b")
	for range 20 {
		shuffled := append([]ringMember(nil), ms...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		r := buildRing(shuffled)
		for _, k := range keys {
			if a, b := ref.members[ref.pick(k)].id, r.members[r.pick(k)].id; a != b {
				t.Fatalf("key %q: %s with one insertion order, %s with another", k, a, b)
			}
		}
	}
}

// TestRingFilterProjection checks that with filters the ring answers as a
// ring built from only the members eligible for the key would.
func TestRingFilterProjection(t *testing.T) {
	ms := []ringMember{
		{id: "all"}, {id: "eu", filters: fset("eu-*")}, {id: "eu1", filters: fset("eu-west-?")},
		{id: "pay", filters: fset("payment")}, {id: "ship", filters: fset("ship*", "eu-*")},
	}
	r := buildRing(ms)
	keys := []string{"payment", "shipping", "shipment", "eu-west-1", "eu-west-2", "eu-north-1", "us-east-1"}
	keys = append(keys, testKeys(2000)...)
	for _, k := range keys {
		var eligible []ringMember
		for _, m := range ms {
			if m.filters.match(k) {
				eligible = append(eligible, ringMember{id: m.id})
			}
		}
		want := ""
		if er := buildRing(eligible); er.pick(k) >= 0 {
			want = er.members[er.pick(k)].id
		}
		got := ""
		if i := r.pick(k); i >= 0 {
			got = r.members[i].id
		}
		if got != want {
			t.Fatalf("key %q: projected ring picks %q, ring of eligible members %q", k, got, want)
		}
	}
	none := buildRing([]ringMember{{id: "a", filters: fset("x")}})
	if none.pick("y") != -1 || buildRing(nil).pick("y") != -1 {
		t.Fatal("a key no member takes must pick no member")
	}
}

func TestRingPickDoesNotAllocate(t *testing.T) {
	plain := ringOf(16)
	filtered := buildRing([]ringMember{{id: "a", filters: fset("device/1*")}, {id: "b"}, {id: "c", filters: fset("x")}})
	keys := testKeys(100)
	i := 0
	for name, r := range map[string]*ring{"plain": plain, "filtered": filtered} {
		if n := testing.AllocsPerRun(1000, func() { r.pick(keys[i%len(keys)]); i++ }); n != 0 {
			t.Errorf("%s: pick allocates %.1f times", name, n)
		}
	}
}

func BenchmarkRingPick(b *testing.B) {
	keys := testKeys(1 << 16)
	for _, bc := range []struct {
		name string
		r    *ring
	}{
		{"members=16", ringOf(16)},
		{"members=16/filtered", buildRing(append(ringOf(15).members, ringMember{id: "f", filters: fset("device/1*", "device/?7")}))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			sink := 0
			i := 0
			for b.Loop() {
				sink += bc.r.pick(keys[i&(1<<16-1)])
				i++
			}
			if sink < 0 {
				b.Fatal("no member")
			}
		})
	}
}

// TestRingPickMatchesLinearScan checks the bucketed search against the
// definition: the first point clockwise at or after the key's hash.
func TestRingPickMatchesLinearScan(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 40} {
		r := ringOf(n)
		for _, k := range testKeys(20000) {
			h := hashKey(k)
			want := r.vnodes[0].idx
			for _, v := range r.vnodes {
				if v.hash >= h {
					want = v.idx
					break
				}
			}
			if got := r.pick(k); got != int(want) {
				t.Fatalf("N=%d key %q: pick %d, linear scan %d", n, k, got, want)
			}
		}
	}
}

// TestRingAsksEachMemberOnce: a pick that walks past members whose filters
// refuse the key asks each of them once, not once per virtual node.
func TestRingAsksEachMemberOnce(t *testing.T) {
	var ms []ringMember
	for i := range 20 {
		ms = append(ms, ringMember{id: fmt.Sprint("m", i), filters: fset("never-*")})
	}
	r := buildRing(ms)
	asked := make(map[int]int)
	if i := r.pickFunc("some-key", func(i int) bool { asked[i]++; return false }); i != -1 {
		t.Fatalf("pick = %d, want -1", i)
	}
	if len(asked) != 20 {
		t.Fatalf("asked %d members, want all 20", len(asked))
	}
	for i, n := range asked {
		if n != 1 {
			t.Fatalf("member %d asked %d times", i, n)
		}
	}
}
