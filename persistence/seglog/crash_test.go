package seglog

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

const (
	crashChildEnv = "SEGLOG_CRASH_CHILD" // the directory: run as the crash child
	crashRunEnv   = "SEGLOG_CRASH_RUN"   // the round, part of the payloads
	crashCkpt     = "checkpoint.json"
)

var flagCrashSeed = flag.Uint64("seglog.crashseed", 0, "run TestCrash with this seed")

// crashPayload is the message the child appends as sequence seq of round run.
func crashPayload(run, seq uint64) []byte { return payload(run, seq, 24+int(seq%200)) }

// loadCheckpoint reads the groups of the checkpoint file in dir (both groups,
// zero states, if there is none).
func loadCheckpoint(dir string) (map[uint64]GroupState, error) {
	groups := map[uint64]GroupState{1: {}, 2: {}}
	b, err := os.ReadFile(filepath.Join(dir, crashCkpt))
	if os.IsNotExist(err) {
		return groups, nil
	}
	if err != nil {
		return nil, err
	}
	return groups, json.Unmarshal(b, &groups)
}

// saveCheckpoint persists s's groups atomically.
func saveCheckpoint(dir string, s *Snapshot) error {
	b, err := json.Marshal(s.Groups)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, crashCkpt+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, crashCkpt)); err != nil {
		return err
	}
	return syncDir(dir)
}

// crashChild appends (with fdatasync) as fast as it can until it is killed,
// printing "A group offset run seq" for each acknowledged append and "R group
// offset" for each offset it resolves; it checkpoints now and then.
func crashChild() int {
	dir := os.Getenv(crashChildEnv)
	run, _ := strconv.ParseUint(os.Getenv(crashRunEnv), 10, 64)
	groups, err := loadCheckpoint(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	l, err := Open(Options{Dir: dir, SegmentSize: 256 << 10, ResolveDelay: time.Millisecond}, groups)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	out := os.Stdout // unbuffered: a line is written once its ack ran
	var seq sync.Mutex
	next := uint64(0)
	acks := 0
	for w := range 2 {
		go func() {
			sem := make(chan struct{}, 16)
			for {
				sem <- struct{}{}
				seq.Lock()
				next++
				n := next
				seq.Unlock()
				gs := []uint64{1 + uint64(w)}
				if n%3 == 0 {
					gs = []uint64{1, 2}
				}
				l.Append(gs, crashPayload(run, n), func(res []Result) {
					// On the notifier goroutine: one at a time.
					for i, r := range res {
						if r.Err != nil {
							fmt.Fprintln(os.Stderr, r.Err)
							os.Exit(3)
						}
						fmt.Fprintf(out, "A %d %d %d %d\n", gs[i], r.Offset, run, n)
						if n%4 == 0 {
							l.Resolve(gs[i], []uint64{r.Offset})
							fmt.Fprintf(out, "R %d %d\n", gs[i], r.Offset)
						}
					}
					acks++
					if acks%500 == 0 {
						s := l.Checkpoint()
						if err := saveCheckpoint(dir, s); err != nil {
							fmt.Fprintln(os.Stderr, err)
							os.Exit(3)
						}
						l.Checkpointed(s)
					}
					<-sem
				})
			}
		}()
	}
	select {} // until killed
}

type ackKey struct{ group, offset uint64 }

// TestCrash runs the crash child, kills it with SIGKILL mid-run, reopens the
// directory and checks that every acknowledged, unresolved offset is there
// with its bytes; several rounds on one directory.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child processes")
	}
	seed := *flagCrashSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d; replay with -seglog.crashseed=%d", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	dir := t.TempDir()
	want := make(map[ackKey][]byte)
	for round := uint64(1); round <= 3; round++ {
		killAfter := 300 + rng.IntN(3000)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashRunEnv+"="+strconv.FormatUint(round, 10))
		cmd.Stderr = tWriter{t}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		acks, killed := 0, false
		for sc.Scan() {
			var kind string
			var g, off, run, n uint64
			if _, err := fmt.Sscan(sc.Text(), &kind, &g, &off); err != nil {
				t.Fatalf("round %d: child said %q: %v", round, sc.Text(), err)
			}
			switch kind {
			case "A":
				if _, err := fmt.Sscanf(sc.Text(), "A %d %d %d %d", &g, &off, &run, &n); err != nil {
					t.Fatalf("round %d: child said %q: %v", round, sc.Text(), err)
				}
				k := ackKey{g, off}
				if _, dup := want[k]; dup {
					t.Fatalf("round %d: offset %d of group %d acknowledged twice", round, off, g)
				}
				want[k] = crashPayload(run, n)
				acks++
			case "R":
				delete(want, ackKey{g, off})
			}
			if acks >= killAfter && !killed {
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				killed = true // read what it wrote before it died
			}
		}
		if err := cmd.Wait(); !killed || err == nil {
			t.Fatalf("round %d: child ended on its own: %v", round, err)
		}
		groups, err := loadCheckpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		l := openLog(t, Options{Dir: dir, SegmentSize: 256 << 10}, groups)
		t.Logf("round %d: killed after %d acks; recovery %+v", round, acks, l.Recovery())
		have := make(map[ackKey][]byte)
		for g := uint64(1); g <= 2; g++ {
			for _, e := range readAll(t, l, g, 0) {
				have[ackKey{g, e.Offset}] = e.Data
			}
		}
		for k, data := range want {
			got, ok := have[k]
			if !ok {
				t.Fatalf("round %d: acknowledged offset %d of group %d is missing", round, k.offset, k.group)
			}
			if string(got) != string(data) {
				t.Fatalf("round %d: offset %d of group %d holds %q, want %q", round, k.offset, k.group, got, data)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
