package seglog

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkAppend measures appends with fdatasync on to one group: appenders
// that each wait for their callback before the next append (a publisher with
// one message in flight), and one appender with 20 in flight:
//
//	go test -run '^$' -bench 'BenchmarkAppend' -benchtime 2s ./persistence/seglog
//
// Each runs with the default commit interval and without one (interval=off).
func BenchmarkAppend(b *testing.B) {
	for _, c := range []struct {
		appenders, inflight int
	}{{1, 1}, {16, 1}, {256, 1}, {1, 20}} {
		for _, iv := range []time.Duration{0, -1} {
			name := fmt.Sprintf("appenders=%d/inflight=%d/interval=%v", c.appenders, c.inflight, DefaultCommitInterval)
			if iv < 0 {
				name = fmt.Sprintf("appenders=%d/inflight=%d/interval=off", c.appenders, c.inflight)
			}
			b.Run(name, func(b *testing.B) {
				benchAppendOpts(b, Options{CommitInterval: iv}, c.appenders, c.inflight, 256)
			})
		}
	}
}

// BenchmarkAppendNoSync is BenchmarkAppend's pipelined case without
// fdatasync: the writer's CPU cost and allocations per append.
func BenchmarkAppendNoSync(b *testing.B) {
	b.ReportAllocs()
	benchAppendOpts(b, Options{NoSync: true}, 1, 64, 256)
}

func benchAppendOpts(b *testing.B, opts Options, appenders, inflight, size int) {
	opts.Dir, opts.Logger = b.TempDir(), slog.New(slog.DiscardHandler)
	l, err := Open(opts, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			b.Error(err)
		}
	}()
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, size)
	groups := []uint64{1}
	errs := make(chan error, appenders)
	var wg sync.WaitGroup
	before := l.Stats()
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
			sem := make(chan struct{}, inflight)
			done := func(r []Result) {
				if r[0].Err != nil {
					select {
					case errs <- r[0].Err:
					default:
					}
				}
				<-sem
			}
			for range n {
				sem <- struct{}{}
				l.Append(groups, msg, done)
			}
			for range inflight {
				sem <- struct{}{}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	st := l.Stats()
	commits := float64(st.Commits - before.Commits)
	b.ReportMetric(float64(b.N)/took.Seconds(), "appends/s")
	b.ReportMetric(float64(st.BytesWritten-before.BytesWritten)/took.Seconds()/1e6, "MB/s")
	if !opts.NoSync {
		b.ReportMetric(float64(st.Syncs-before.Syncs)/commits, "fdatasyncs/commit")
	}
	b.ReportMetric(float64(b.N)/commits, "appends/commit")
	b.ReportMetric(float64((st.WriteTime-before.WriteTime).Microseconds())/commits, "write+sync-µs/commit")
	b.ReportMetric(float64(took.Microseconds())/commits, "µs/commit")
}

// BenchmarkFdatasync measures one small write plus fdatasync into a segment
// prepared by writing zeros (what createSegment does) and into one
// allocated with fallocate (unwritten extents):
//
//	go test -run '^$' -bench 'BenchmarkFdatasync' -benchtime 2000x ./persistence/seglog
func BenchmarkFdatasync(b *testing.B) {
	for _, mode := range []string{"prezeroed", "fallocated"} {
		b.Run(mode, func(b *testing.B) {
			const size = 64 << 20
			dir := b.TempDir()
			var f *os.File
			if mode == "prezeroed" {
				s, err := createSegment(dir, 1, size, false)
				if err != nil {
					b.Fatal(err)
				}
				f = s.f
			} else {
				var err error
				if f, err = os.Create(filepath.Join(dir, "f")); err != nil {
					b.Fatal(err)
				}
				if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
					b.Skip("fallocate:", err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
			}
			defer f.Close()
			buf := make([]byte, 1000)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				if _, err := f.WriteAt(buf, int64(i%(size/len(buf)))*int64(len(buf))); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := fdatasync(f); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
