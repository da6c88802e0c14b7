package persistence

import (
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
)

// diskBytes returns the bytes the file occupies on disk (its allocated blocks:
// bbolt grows the file ahead of use, sparsely).
func diskBytes(tb testing.TB, path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

func benchDB(b *testing.B, noSync bool) *DB {
	db, err := Open(b.TempDir(), Options{NoSync: noSync, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := db.Close(); err != nil {
			b.Error(err)
		}
	})
	return db
}

// BenchmarkAppend measures blocking appends to one group from concurrent
// appenders (each waits for its commit before its next append):
//
//	go test -run '^$' -bench 'BenchmarkAppend/' -benchtime 3s ./persistence
func BenchmarkAppend(b *testing.B) {
	for _, sync := range []bool{true, false} {
		for _, appenders := range []int{1, 16, 256} {
			for _, size := range []int{100, 4096} {
				name := fmt.Sprintf("fsync=%v/appenders=%d/payload=%d", map[bool]string{true: "on", false: "off"}[sync], appenders, size)
				b.Run(name, func(b *testing.B) { benchAppend(b, !sync, appenders, size) })
			}
		}
	}
}

func benchAppend(b *testing.B, noSync bool, appenders, size int) {
	db := benchDB(b, noSync)
	s := db.Groups()
	const g = "bench/orders/#"
	if _, err := s.EnsureGroup(g, GroupConfig{}); err != nil {
		b.Fatal(err)
	}
	m := keyshared.Message{Topic: "orders/1234/created", Key: "device-1234", QoS: 1, Payload: make([]byte, size), PublishedAt: time.Now()}
	errs := make(chan error, appenders)
	var wg sync.WaitGroup
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	for a := range appenders {
		n := b.N / appenders
		if a < b.N%appenders {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				if _, err := s.Append(g, m); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	st := db.LogStats()
	b.ReportMetric(float64(st.Appends)/float64(st.Commits), "ops/commit")
	b.ReportMetric(float64(st.Syncs)/float64(st.Commits), "fdatasyncs/commit")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(st.Commits), "µs/commit")
}

// BenchmarkAppendAckCycles appends and acks b.N messages of 100 bytes (windows
// of 256 asynchronous appends, then their resolution) and reports the data
// dir's size at the end. For the 1,000,000-cycle figure:
//
//	go test -run '^$' -bench 'BenchmarkAppendAckCycles' -benchtime 1000000x ./persistence
func BenchmarkAppendAckCycles(b *testing.B) {
	for _, sync := range []bool{true, false} {
		b.Run(fmt.Sprintf("fsync=%s", map[bool]string{true: "on", false: "off"}[sync]), func(b *testing.B) {
			db := benchDB(b, !sync)
			s := db.Groups()
			if _, err := s.EnsureGroup("cycles/#", GroupConfig{}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			appendAckCycles(b, s, "cycles/#", b.N, make([]byte, 100))
			if err := s.Flush(); err != nil {
				b.Fatal(err)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			info, err := s.Group("cycles/#")
			if err != nil {
				b.Fatal(err)
			}
			if info.Head != uint64(b.N) || info.StoredMessages != 0 {
				b.Fatalf("after %d cycles: %+v", b.N, info)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(diskBytes(b, db.Path())), "db-disk-bytes")
			b.ReportMetric(float64(db.LogStats().SegmentBytes), "segment-bytes")
		})
	}
}

// BenchmarkReadFrom measures the dispatcher's read path: batches of 100.
func BenchmarkReadFrom(b *testing.B) {
	db := benchDB(b, true)
	s := db.Groups()
	if _, err := s.EnsureGroup("read/#", GroupConfig{}); err != nil {
		b.Fatal(err)
	}
	const n = 10_000
	var wg sync.WaitGroup
	wg.Add(n)
	for range n {
		s.AppendAsync("read/#", fullMsg(1), func(uint64, error) { wg.Done() })
	}
	wg.Wait()
	l, _ := s.Log("read/#")
	buf := make([]keyshared.Message, 0, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 100 {
		var err error
		if buf, err = l.ReadFrom(uint64(i%n)+1, 100, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFsync measures the disk under the benchmarks: one 4 KiB write and
// fdatasync per op (a bbolt commit makes two). Run it next to BenchmarkAppend
// to tell a slow disk from a slow store.
func BenchmarkFsync(b *testing.B) {
	f, err := os.Create(b.TempDir() + "/probe")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	b.ResetTimer()
	for i := range b.N {
		if _, err := f.WriteAt(page, int64(i%256)*4096); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
}
