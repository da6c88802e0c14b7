package persistence

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
	"github.com/keyline-mq/keyline/keyshared"
	bolt "go.etcd.io/bbolt"
)

// Tests of the bbolt store alone: locking, bad files, crashes, a full disk,
// file size under steady append and ack.

// childEnv selects the role of a re-executed test binary; childDirEnv its data dir.
const (
	childEnv    = "KEYLINE_PERSISTENCE_CHILD"
	childDirEnv = "KEYLINE_PERSISTENCE_CHILD_DIR"
)

// startChild re-executes the test binary running only the test named role.
func startChild(t *testing.T, role, dir string) (cmd *exec.Cmd, stdin io.WriteCloser, stdout *bufio.Scanner) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+role, childDirEnv+"="+dir)
	cmd.Stderr = tWriter{t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, stdin, bufio.NewScanner(out)
}

// TestChild is the body of child processes; it does nothing in a normal run.
func TestChild(t *testing.T) {
	role, dir := os.Getenv(childEnv), os.Getenv(childDirEnv)
	switch role {
	case "":
		t.Skip("runs only as a child process of TestOpenLocked and TestCrashSafety")
	case "hold":
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin) // until the parent closes our stdin
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	case "crash":
		crashChild(t, dir)
	default:
		t.Fatalf("unknown child role %q", role)
	}
}

func TestOpenLocked(t *testing.T) {
	dir := t.TempDir()
	cmd, stdin, out := startChild(t, "hold", dir)
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("child did not open the database: %q %v", out.Text(), out.Err())
	}
	start := time.Now()
	db, err := Open(dir, Options{OpenTimeout: 100 * time.Millisecond})
	if err == nil {
		db.Close()
		t.Fatal("opened a database another process holds")
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), filepath.Join(dir, FileName)) {
		t.Fatalf("Open = %v, want ErrLocked naming the file", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Open took %v to fail", d)
	}
	t.Logf("Open: %v", err)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	// Once the other process is gone the file opens.
	openTestDB(t, dir, Options{})
}

func TestOpenBadFiles(t *testing.T) {
	write := func(t *testing.T, data []byte) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, FileName), data, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	foreign := map[string][]byte{
		"text":      []byte(strings.Repeat("this is not a database\n", 1000)),
		"short":     []byte("hello"),
		"zeros":     make([]byte, 64<<10),
		"sqlite":    append([]byte("SQLite format 3\x00"), make([]byte, 8192)...),
		"json":      []byte(`{"groups": []}`),
		"one page":  append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 4080)...),
		"truncated": nil, // filled below: the first 6 KiB of a real database
	}
	{
		dir := t.TempDir()
		db := openTestDB(t, dir, Options{NoSync: true})
		ensure(t, db.Groups(), "x/y", GroupConfig{})
		db.Close()
		data, err := os.ReadFile(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatal(err)
		}
		foreign["truncated"] = data[:6<<10]
	}
	{
		// A real database whose pages past the meta pages are garbled.
		dir := t.TempDir()
		db := openTestDB(t, dir, Options{NoSync: true})
		for i := range 20 {
			name := fmt.Sprintf("g/%d", i)
			ensure(t, db.Groups(), name, GroupConfig{})
			for range 50 {
				mustAppend(t, db.Groups(), name, fullMsg(i))
			}
		}
		db.Close()
		data, err := os.ReadFile(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatal(err)
		}
		for i := 2 * 4096; i < len(data); i++ {
			data[i] = byte(i*7) ^ 0xa5
		}
		foreign["garbled pages"] = data
	}
	for name, data := range foreign {
		t.Run(name, func(t *testing.T) {
			dir := write(t, data)
			db, err := Open(dir, Options{OpenTimeout: 100 * time.Millisecond})
			if err == nil {
				db.Close()
				t.Fatal("opened a foreign file")
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), FileName) {
				t.Fatalf("Open = %v, want ErrCorrupt naming the file", err)
			}
			t.Logf("Open: %v", err)
			// Nothing was written over it.
			if got, _ := os.ReadFile(filepath.Join(dir, FileName)); !slices.Equal(got, data) {
				t.Fatal("Open changed the file")
			}
		})
	}

	// A bbolt file whose group data is damaged.
	damaged := map[string]func(root *bolt.Bucket) error{
		"group is a value": func(root *bolt.Bucket) error { return root.Put([]byte("a/b"), []byte("x")) },
		"bad state": func(root *bolt.Bucket) error {
			return root.Bucket([]byte("x/y")).Put(stateKey, []byte{1, 2})
		},
		"state from an earlier keyline": func(root *bolt.Bucket) error {
			return root.Bucket([]byte("x/y")).Put(stateKey, []byte{1, 5, 1, 0, 5, 0, 0, 0, 0, 0, 0})
		},
		"cursor past head": func(root *bolt.Bucket) error {
			st := groupState{}
			st.Head, st.Cursor = 5, 6
			return root.Bucket([]byte("x/y")).Put(stateKey, st.encode())
		},
		"missing dlq": func(root *bolt.Bucket) error { return root.Bucket([]byte("x/y")).DeleteBucket(dlqBucket) },
		"bad meta":    func(root *bolt.Bucket) error { return root.Bucket([]byte("x/y")).Put(metaKey, []byte("{")) },
		"bad name": func(root *bolt.Bucket) error {
			_, err := root.CreateBucket([]byte("no slash"))
			return err
		},
	}
	for name, damage := range damaged {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			db := openTestDB(t, dir, Options{NoSync: true})
			ensure(t, db.Groups(), "x/y", GroupConfig{})
			mustAppend(t, db.Groups(), "x/y", msg("t", "p"))
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := bolt.Open(filepath.Join(dir, FileName), 0o600, &bolt.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			err = b.Update(func(tx *bolt.Tx) error { return damage(tx.Bucket(groupsBucket)) })
			b.Close()
			if err != nil {
				t.Fatal(err)
			}
			if db, err = Open(dir, Options{}); err == nil {
				db.Close()
				t.Fatal("opened a damaged file")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open = %v, want ErrCorrupt", err)
			}
			t.Logf("Open: %v", err)
		})
	}

	t.Run("data dir is a file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path, Options{})
		if err == nil || !strings.HasPrefix(err.Error(), "persistence: ") {
			t.Fatalf("Open = %v", err)
		}
		t.Logf("Open: %v", err)
	})
}

// crashChild appends forever with fsync on and reports every append that
// returned success on stdout as "<group> <worker> <seq> <offset>"; it also
// resolves group b's offsets up to a point and reports "cursor b <cursor>"
// once that is durable.
// Worker ids come from the environment so that rounds differ.
func crashChild(t *testing.T, dir string) {
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := db.Groups()
	for _, g := range []string{"crash/a", "crash/b"} {
		if _, err := s.EnsureGroup(g, GroupConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	round := os.Getenv("KEYLINE_CRASH_ROUND")
	var outMu sync.Mutex
	report := func(format string, args ...any) {
		line := fmt.Sprintf(format+"\n", args...)
		outMu.Lock()
		defer outMu.Unlock()
		if _, err := os.Stdout.WriteString(line); err != nil {
			os.Exit(3)
		}
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2)
	}
	// Blocking appenders to a.
	for w := range 4 {
		go func() {
			for seq := 0; ; seq++ {
				off, err := s.Append("crash/a", msg("t", fmt.Sprintf("%s%d-%d", round, w, seq)))
				if err != nil {
					fail(err)
				}
				report("a %s%d %d %d", round, w, seq, off)
			}
		}()
	}
	// A pipelined asynchronous appender to a, up to 32 outstanding.
	go func() {
		sem := make(chan struct{}, 32)
		for seq := 0; ; seq++ {
			sem <- struct{}{}
			s.AppendAsync("crash/a", msg("t", fmt.Sprintf("%s9-%d", round, seq)), func(off uint64, err error) {
				if err != nil {
					fail(err)
				}
				report("a %s9 %d %d", round, seq, off)
				<-sem
			})
		}
	}()
	// b: append and ack, so that trimming runs while we are killed.
	l, err := s.Log("crash/b")
	if err != nil {
		t.Fatal(err)
	}
	var resolved uint64
	for seq := 0; ; seq++ {
		off, err := s.Append("crash/b", msg("t", fmt.Sprintf("%s0-%d", round, seq)))
		if err != nil {
			fail(err)
		}
		report("b %s0 %d %d", round, seq, off)
		if seq%10 == 9 {
			var offs []uint64
			for o := resolved + 1; o <= off-3; o++ {
				offs = append(offs, o)
			}
			l.Resolve(offs)
			resolved = off - 3
			if err := s.Flush(); err != nil {
				fail(err)
			}
			report("cursor b %d", off-3)
		}
	}
}

func TestCrashSafety(t *testing.T) {
	dir := t.TempDir()
	type ack struct{ group, worker, payload string }
	acked := map[uint64]ack{} // offset in group a or b -> what was acknowledged there
	ackedB := map[uint64]string{}
	var cursorB uint64
	rounds := 2
	if testing.Short() {
		rounds = 1
	}
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=crash", childDirEnv+"="+dir, fmt.Sprintf("KEYLINE_CRASH_ROUND=%d", round+1))
		cmd.Stderr = tWriter{t}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		lines, killed := 0, false
		for sc.Scan() {
			var g, w string
			var seq int
			var off uint64
			if _, err := fmt.Sscanf(sc.Text(), "cursor b %d", &off); err == nil {
				cursorB = max(cursorB, off)
			} else if _, err := fmt.Sscanf(sc.Text(), "%s %s %d %d", &g, &w, &seq, &off); err == nil {
				p := fmt.Sprintf("%s-%d", w, seq)
				if g == "a" {
					acked[off] = ack{g, w, p}
				} else {
					ackedB[off] = p
				}
			} else {
				t.Fatalf("child said %q", sc.Text())
			}
			if lines++; lines == 3000 && !killed {
				// SIGKILL mid-stream; lines already written are still read below.
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed = true
			}
		}
		err = cmd.Wait()
		if !killed {
			t.Fatalf("child ended before it was killed: %v", err)
		}
		t.Logf("round %d: child killed after %d acknowledged appends (%v)", round+1, lines, err)

		db := openTestDB(t, dir, Options{})
		if err := db.Check(); err != nil {
			t.Fatal(err)
		}
		s := db.Groups()
		la, _ := s.Log("crash/a")
		all := readAll(t, la, 0)
		if got := offsets(all); !slices.Equal(got, seq(1, la.Head())) {
			t.Fatalf("log a is not 1..%d without gaps: %d entries", la.Head(), len(got))
		}
		// Every acknowledged append is there, at its offset.
		for off, a := range acked {
			if off > uint64(len(all)) || string(all[off-1].Payload) != a.payload {
				t.Fatalf("acknowledged %s at offset %d is missing or different", a.payload, off)
			}
		}
		// Each worker's messages appear in order and without gaps (the unacknowledged
		// tail may or may not have made it).
		next := map[string]int{}
		for _, m := range all {
			w, seqStr, _ := strings.Cut(string(m.Payload), "-")
			var n int
			fmt.Sscan(seqStr, &n)
			if n != next[w] {
				t.Fatalf("worker %s: seq %d at offset %d, want %d", w, n, m.Offset, next[w])
			}
			next[w]++
		}
		lb, _ := s.Log("crash/b")
		c, _ := lb.LoadCursor()
		if c < cursorB {
			t.Fatalf("cursor b = %d, the child made %d durable", c, cursorB)
		}
		bs := readAll(t, lb, 0)
		if len(bs) > 0 && (bs[0].Offset > c+1 || !slices.Equal(offsets(bs), seq(bs[0].Offset, lb.Head()))) {
			t.Fatalf("log b holds %v with cursor %d: an entry above the cursor is gone", offsets(bs), c)
		}
		for off, p := range ackedB {
			if off > c && (len(bs) == 0 || off < bs[0].Offset || string(bs[off-bs[0].Offset].Payload) != p) {
				t.Fatalf("acknowledged %s at offset %d above the cursor is missing", p, off)
			}
		}
		info := mustInfo(t, s, "crash/b")
		t.Logf("round %d: a head %d, b head %d cursor %d stored %d", round+1, la.Head(), info.Head, info.Cursor, info.StoredMessages)
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// mountTmpfs mounts a tmpfs of size bytes at dir, or skips the test.
func mountTmpfs(t *testing.T, dir string, size int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

func TestFullDisk(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "small")
	mountTmpfs(t, mnt, 1<<20)
	ballast := filepath.Join(mnt, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 256<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mnt, "data")
	db := openTestDB(t, dir, Options{SegmentSize: 64 << 10})
	s := db.Groups()
	const g = "full/#"
	l := ensure(t, s, g, GroupConfig{})
	payload := func(i int) string { return fmt.Sprintf("%04d", i) + strings.Repeat("x", 1000) }
	var failure error
	n := 0
	for ; n < 5000; n++ {
		off, err := s.Append(g, msg("t", payload(n)))
		if err != nil {
			failure = err
			break
		}
		if off != uint64(n+1) {
			t.Fatalf("offset %d, want %d", off, n+1)
		}
	}
	if failure == nil {
		t.Fatal("a 1 MiB tmpfs took 5 MB of appends")
	}
	t.Logf("after %d appends: %v", n, failure)
	if !errors.Is(failure, syscall.ENOSPC) || !strings.HasPrefix(failure.Error(), "persistence: ") {
		t.Fatalf("error = %v, want an error wrapping ENOSPC", failure)
	}
	// Still full: async appends and cursor saves fail too, and say so.
	errc := make(chan error, 1)
	s.AppendAsync(g, msg("t", payload(n)), func(_ uint64, err error) { errc <- err })
	if err := <-errc; !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("async append on a full disk = %v", err)
	}
	check := func(s GroupStore, l keyshared.Log, want int) {
		t.Helper()
		all := readAll(t, l, 1)
		if len(all) != want || l.Head() != uint64(want) {
			t.Fatalf("log holds %d entries (head %d), want %d", len(all), l.Head(), want)
		}
		for i, m := range all {
			if string(m.Payload) != payload(i) {
				t.Fatalf("entry %d changed", i+1)
			}
		}
		if info := mustInfo(t, s, g); info.StoredMessages != uint64(want) {
			t.Fatalf("info = %+v", info)
		}
	}
	check(s, l, n)
	// Space comes back: appends work again and continue the offsets.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if off, err := s.Append(g, msg("t", payload(n))); err != nil || off != uint64(n+1) {
		t.Fatalf("append after freeing space = %d, %v", off, err)
	}
	if err := db.Check(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTestDB(t, dir, Options{SegmentSize: 64 << 10})
	l, _ = db.Groups().Log(g)
	check(db.Groups(), l, n+1)
}

func TestRestartWithMembers(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir, Options{})
	ensure(t, db.Groups(), "m/#", GroupConfig{})
	long := time.Now().Add(-24 * time.Hour)
	if err := db.Groups().MembersChanged("m/#", 3, long); err != nil {
		t.Fatal(err)
	}
	db.Close() // as if the broker stopped with members connected
	before := time.Now()
	db = openTestDB(t, dir, Options{})
	info := mustInfo(t, db.Groups(), "m/#")
	if info.Members != 0 || info.LastSeen.Before(before) {
		t.Fatalf("after restart: members %d, last seen %v (want 0 and >= %v)", info.Members, info.LastSeen, before)
	}
	if swept, err := db.Groups().SweepIdle(time.Now().Add(time.Hour), 2*time.Hour); err != nil || len(swept) != 0 {
		t.Fatalf("swept %v, %v: the TTL must count from the restart", swept, err)
	}
}

// appendAckCycles appends n messages to group and acks them as a dispatcher
// would: a window of asynchronous appends, then their resolution.
func appendAckCycles(tb testing.TB, s GroupStore, group string, n int, payload []byte) {
	l, err := s.Log(group)
	if err != nil {
		tb.Fatal(err)
	}
	const window = 256
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	var offs []uint64
	for done := 0; done < n; {
		k := min(window, n-done)
		wg.Add(k)
		offs = offs[:0]
		for range k {
			s.AppendAsync(group, keyshared.Message{Topic: "t", Key: "k", QoS: 1, Payload: payload}, func(off uint64, err error) {
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				offs = append(offs, off)
				mu.Unlock()
				wg.Done()
			})
		}
		wg.Wait()
		if firstErr != nil {
			tb.Fatal(firstErr)
		}
		l.Resolve(offs)
		done += k
	}
}

// dirBytes returns the bytes the files under dir occupy on disk.
func dirBytes(tb testing.TB, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n += diskBytes(tb, path)
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// Steady append+ack keeps the data dir bounded: resolved segments go.
func TestSteadyAppendAckKeepsTheDataDirBounded(t *testing.T) {
	dir := t.TempDir()
	db := openTestDB(t, dir, Options{NoSync: true, SegmentSize: 256 << 10, CheckpointInterval: 10 * time.Millisecond})
	s := db.Groups()
	ensure(t, s, "steady/#", GroupConfig{})
	payload := make([]byte, 100)
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	appendAckCycles(t, s, "steady/#", n, payload)
	mustFlush(t, s)
	info := mustInfo(t, s, "steady/#")
	if info.StoredMessages != 0 || info.Head != uint64(n) {
		t.Fatalf("info = %+v", info)
	}
	// Segments go once a checkpoint covers them: wait for one.
	poll.Within(10*time.Second, func() bool { // the background checkpoint; checked below
		mustFlush(t, s)
		return db.LogStats().Segments <= 3
	})
	st := db.LogStats()
	size := dirBytes(t, dir)
	t.Logf("data dir %d bytes after %d cycles of %d bytes (%d MB written); log %+v", size, n, len(payload), st.BytesWritten>>20, st)
	// Unbounded, the segments would hold n entries of about 130 bytes each.
	if st.Segments > 3 || size > 4<<20 {
		t.Fatalf("data dir holds %d segments, %d bytes, while everything was acked", st.Segments, size)
	}
}

// An operation that fails in the middle of a transaction fails alone: the
// rest of its batch is committed in a new transaction.
func TestBatchAbortRetriesOthers(t *testing.T) {
	db := openTestDB(t, t.TempDir(), Options{NoSync: true})
	sess, err := db.OpenSessions()
	if err != nil {
		t.Fatal(err)
	}
	c := db.commit
	entered, release := make(chan struct{}), make(chan struct{})
	blockerDone := make(chan error, 1)
	go func() {
		blockerDone <- c.do(func(*bolt.Tx) error { close(entered); <-release; return nil })
	}()
	<-entered // the committer is inside a transaction; what follows forms the next batch
	sess.Put(KindSysInfo, []byte("before"), []byte("1"))
	boom := errors.New("boom")
	abortDone := make(chan error, 1)
	go func() { // an op that aborts its transaction after writing
		abortDone <- c.do(func(tx *bolt.Tx) error {
			if err := tx.Bucket(sessionsBucket).Bucket([]byte(KindSysInfo)).Put([]byte("junk"), []byte("x")); err != nil {
				return fatal(err)
			}
			return fatal(boom)
		})
	}()
	// Wait until the aborting op is queued behind the first write.
	for {
		c.mu.Lock()
		n := len(c.mu.ops)
		c.mu.Unlock()
		if n == 2 {
			break
		}
		runtime.Gosched()
	}
	// A write bbolt refuses (a key over its limit) fails alone, without aborting.
	tooBig := make(chan []error, 1)
	go func() {
		tooBig <- sess.Write(SessionWrite{Kind: KindSysInfo, Key: make([]byte, MaxSessionKey+1), Val: []byte("x")},
			SessionWrite{Kind: KindSysInfo, Key: []byte("after"), Val: []byte("2")})
	}()
	for {
		c.mu.Lock()
		n := len(c.mu.ops)
		c.mu.Unlock()
		if n == 4 {
			break
		}
		runtime.Gosched()
	}
	close(release)
	if err := <-blockerDone; err != nil {
		t.Fatal(err)
	}
	if err := <-abortDone; !errors.Is(err, boom) {
		t.Fatalf("aborting op = %v, want boom", err)
	}
	errs := <-tooBig
	if errs[0] == nil || errs[1] != nil {
		t.Fatalf("writes = %v: want the oversized key refused and the other stored", errs)
	}
	for key, want := range map[string]string{"before": "1", "after": "2", "junk": ""} {
		v, err := sess.Get(KindSysInfo, []byte(key))
		if err != nil || string(v) != want {
			t.Fatalf("%s = %q, %v; want %q (the aborted op's write must be gone)", key, v, err, want)
		}
	}
	if st := db.CommitStats(); st.Failures != 0 || st.FailedOps != 2 {
		t.Fatalf("stats = %+v", st)
	}
}
