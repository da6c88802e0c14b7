package outbox

import (
	"math/rand/v2"
	"testing"
)

// TestIDTableAgreesWithAMap churns the table with the patterns a session
// makes (ids handed out in order, acknowledged mostly in order, sometimes
// not; wrapping past 65535) and compares it with a map after every step.
func TestIDTableAgreesWithAMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tab idTable
	ref := map[uint16]uint64{}
	next := uint16(65000)
	var live []uint16
	for step := range 200000 {
		if len(live) < 300 && r.IntN(3) > 0 {
			if next++; next == 0 {
				next = 1
			}
			if _, used := ref[next]; used {
				continue
			}
			tab.put(next, uint64(step))
			ref[next] = uint64(step)
			live = append(live, next)
		} else if len(live) > 0 {
			i := 0
			if r.IntN(5) == 0 {
				i = r.IntN(len(live))
			}
			id := live[i]
			live = append(live[:i], live[i+1:]...)
			tab.del(id)
			delete(ref, id)
		}
		if tab.len() != len(ref) {
			t.Fatalf("step %d: %d entries, want %d", step, tab.len(), len(ref))
		}
		if step%97 == 0 {
			for id, seq := range ref {
				if got, ok := tab.get(id); !ok || got != seq {
					t.Fatalf("step %d: get(%d) = %d %v, want %d", step, id, got, ok, seq)
				}
			}
			n := 0
			tab.each(func(uint16) { n++ })
			if n != len(ref) {
				t.Fatalf("step %d: each saw %d", step, n)
			}
		}
		if _, ok := tab.get(uint16(r.IntN(65535) + 1)); ok && len(ref) == 0 {
			t.Fatalf("step %d: found an id in an empty table", step)
		}
	}
}

// len returns the number of ids in the table.
func (t *idTable) len() int { return t.n }
