package seglog

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var (
	flagSeed  = flag.Uint64("seglog.seed", 0, "run the model test with only this seed (replays a failure)")
	flagSeeds = flag.Int("seglog.seeds", 16, "number of seeds the model test runs")
	flagSteps = flag.Int("seglog.steps", 600, "random steps per seed in the model test")
)

// mgroup is the model of one group: its head and unresolved messages.
type mgroup struct {
	head  uint64
	unres map[uint64][]byte
	lim   Limits
}

func (g *mgroup) cursor() uint64 {
	c := g.head
	for off := range g.unres {
		c = min(c, off-1)
	}
	return c
}

// TestModel drives the log with random appends, resolutions, reads,
// checkpoints, reopenings, group additions and drops, and compares it with a
// map model after every step.
func TestModel(t *testing.T) {
	seeds := []uint64{*flagSeed}
	if *flagSeed == 0 {
		seeds = seeds[:0]
		base := uint64(time.Now().UnixNano())
		for i := range *flagSeeds {
			seeds = append(seeds, base+uint64(i))
		}
		t.Logf("seeds %d..%d (%d steps each); replay one with -seglog.seed=N", seeds[0], seeds[len(seeds)-1], *flagSteps)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("replay: go test ./persistence/seglog -run 'TestModel/%d$' -seglog.seed=%d -seglog.steps=%d", seed, seed, *flagSteps)
				}
			}()
			runModel(t, seed, *flagSteps)
		})
	}
}

func runModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	opts := Options{Dir: t.TempDir(), SegmentSize: MinSegmentSize, NoSync: true, CompactLiveRatio: 0.5, ResolveDelay: time.Millisecond}
	if rng.IntN(2) == 0 {
		opts.CacheBytes, opts.GroupCacheBytes = 4<<10, 1<<10
	}
	opts.Logger = testLogger(t)
	opts.Logger = nil
	l := openLog(t, opts, nil)
	model := map[uint64]*mgroup{}
	ckpt := map[uint64]GroupState{} // the last persisted checkpoint
	var total Stats                 // of the logs closed so far
	nextID := uint64(1)
	msgN := uint64(0)
	addGroup := func() {
		id := nextID
		nextID++
		var lim Limits
		switch rng.IntN(4) {
		case 0:
			lim = Limits{MaxMessages: uint64(5 + rng.IntN(20)), DropOldest: true}
		case 1:
			lim = Limits{MaxMessages: uint64(5 + rng.IntN(20))}
		}
		if err := l.AddGroup(id, GroupState{}, lim); err != nil {
			t.Fatal(err)
		}
		model[id] = &mgroup{unres: map[uint64][]byte{}, lim: lim}
	}
	for range 3 {
		addGroup()
	}
	ids := func() []uint64 { return slices.Sorted(maps.Keys(model)) }
	for step := range steps {
		switch p := rng.IntN(100); {
		case p < 40: // appends, some pipelined
			n := 1 + rng.IntN(8)
			type sub struct {
				gs  []uint64
				msg []byte
				ch  chan []Result
			}
			var subs []sub
			for range n {
				all := ids()
				if len(all) == 0 {
					break
				}
				var gs []uint64
				for _, id := range all {
					if rng.IntN(len(all)) == 0 || len(gs) == 0 && id == all[len(all)-1] {
						gs = append(gs, id)
					}
				}
				msgN++
				msg := payload(seed, msgN, 1+rng.IntN(300))
				ch := make(chan []Result, 1)
				l.Append(gs, msg, func(r []Result) { ch <- append([]Result(nil), r...) })
				subs = append(subs, sub{gs, msg, ch})
			}
			for _, s := range subs {
				res := <-s.ch
				for i, id := range s.gs {
					g := model[id]
					full := g.lim.MaxMessages > 0 && uint64(len(g.unres))+1 > g.lim.MaxMessages
					if full && !g.lim.DropOldest {
						if res[i].Err == nil {
							t.Fatalf("step %d: group %d: append past its limit accepted", step, id)
						}
						continue
					}
					if res[i].Err != nil || res[i].Offset != g.head+1 {
						t.Fatalf("step %d: group %d: append got %+v, want offset %d", step, id, res[i], g.head+1)
					}
					for full {
						delete(g.unres, slices.Min(slices.Collect(maps.Keys(g.unres))))
						full = uint64(len(g.unres))+1 > g.lim.MaxMessages
					}
					g.head++
					g.unres[g.head] = s.msg
				}
			}
		case p < 65: // resolve some unresolved offsets (and some resolved or unknown ones)
			for _, id := range ids() {
				g := model[id]
				var offs []uint64
				for off := range g.unres {
					if rng.IntN(3) == 0 {
						offs = append(offs, off)
						delete(g.unres, off)
					}
				}
				// An offset at or below the head (maybe resolved already) and one
				// above it (no effect).
				any := uint64(rng.IntN(int(g.head) + 1))
				delete(g.unres, any)
				offs = append(offs, g.head+1+uint64(rng.IntN(3)), any)
				rng.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
				l.Resolve(id, offs)
			}
		case p < 80: // read from a random point
			for _, id := range ids() {
				from := uint64(rng.IntN(int(model[id].head) + 2))
				checkRead(t, step, l, id, model[id], from, 1+rng.IntN(20))
			}
		case p < 88:
			s := l.Checkpoint()
			ckpt = maps.Clone(s.Groups)
			l.Checkpointed(s)
		case p < 93: // clean reopen: the last checkpoint, zero states for groups added after it
			groups := map[uint64]GroupState{}
			for id := range model {
				groups[id] = ckpt[id]
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			total = addStats(total, l.Stats())
			l = openLog(t, opts, groups)
			for id, g := range model {
				if err := l.SetLimits(id, g.lim); err != nil {
					t.Fatal(err)
				}
			}
		case p < 96:
			if all := ids(); len(all) > 1 {
				id := all[rng.IntN(len(all))]
				l.DropGroup(id)
				delete(model, id)
				if err := l.AddGroup(id, GroupState{}, Limits{}); err == nil {
					t.Fatalf("step %d: a dropped id was added again", step)
				}
			}
		default:
			addGroup()
		}
		if err := l.checkInvariants(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for id, g := range model {
			gi, err := l.Group(id)
			if err != nil {
				t.Fatal(err)
			}
			if gi.Head != g.head || gi.Messages != uint64(len(g.unres)) || gi.Cursor != g.cursor() {
				t.Fatalf("step %d: group %d: %+v, model head %d, %d unresolved, cursor %d", step, id, gi, g.head, len(g.unres), g.cursor())
			}
		}
	}
	for id, g := range model {
		checkRead(t, steps, l, id, g, 0, len(g.unres)+1)
	}
	st := addStats(total, l.Stats())
	t.Logf("%d commits, %d records, %d moved by %d compactions, %d segments removed, %d of %d entries read from the cache",
		st.Commits, st.Records, st.Moved, st.Compactions, st.Removed, st.CacheHits, st.CacheHits+st.CacheMisses)
}

// checkRead compares ReadFrom(from, max) with the model.
func checkRead(t *testing.T, step int, l *Log, id uint64, g *mgroup, from uint64, max int) {
	t.Helper()
	got, err := l.ReadFrom(id, from, max, nil)
	if err != nil {
		t.Fatalf("step %d: ReadFrom(%d, %d): %v", step, id, from, err)
	}
	want := slices.Sorted(maps.Keys(g.unres))
	i := 0
	for i < len(want) && want[i] < from {
		i++
	}
	want = want[i:min(i+max, len(want))]
	if len(got) != len(want) {
		t.Fatalf("step %d: group %d: ReadFrom(%d, %d) = %v, want %v", step, id, from, max, offsets(got), want)
	}
	for i, e := range got {
		if e.Offset != want[i] || !bytes.Equal(e.Data, g.unres[e.Offset]) {
			t.Fatalf("step %d: group %d: entry %d is %d %q, want %d", step, id, i, e.Offset, e.Data, want[i])
		}
	}
}

func addStats(a, b Stats) Stats {
	a.Commits += b.Commits
	a.Records += b.Records
	a.Moved += b.Moved
	a.Compactions += b.Compactions
	a.Removed += b.Removed
	a.CacheHits += b.CacheHits
	a.CacheMisses += b.CacheMisses
	return a
}
