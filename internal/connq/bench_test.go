package connq

import (
	"io"
	"testing"
)

// BenchmarkEnqueueDrain pushes 64-byte shared frames through one connection
// to a loopback TCP reader: the fan-out hot path for one subscriber.
func BenchmarkEnqueueDrain(b *testing.B) {
	a, peer := tcpPair(b)
	done := make(chan int64)
	go func() {
		n, _ := io.Copy(io.Discard, peer)
		done <- n
	}()
	stats := new(Stats)
	c := New(a, Limits{Soft: 1 << 20, Hard: 8 << 20, Policy: DropNewest}, stats, nil)
	frame := make([]byte, 64)
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	b.ResetTimer()
	queued := 0
	for range b.N {
		if c.Enqueue(frame) {
			queued++
		}
	}
	_ = c.Close()
	<-c.Done()
	got := <-done
	b.StopTimer()
	if got != int64(queued*len(frame)) {
		b.Fatalf("peer read %d bytes, want %d", got, queued*len(frame))
	}
	b.ReportMetric(float64(stats.Frames.Load())/float64(max(1, stats.Writes.Load())), "frames/writev")
	b.ReportMetric(float64(b.N-queued)/float64(b.N)*100, "%dropped")
	b.ReportMetric(float64(queued)/b.Elapsed().Seconds(), "frames/s")
}

// BenchmarkFanoutEnqueue offers one shared frame to 100 connections, as a
// publish to 100 QoS 0 subscribers does.
func BenchmarkFanoutEnqueue(b *testing.B) {
	const subs = 100
	conns := make([]*Conn, subs)
	readers := make(chan int64, subs)
	stats := new(Stats)
	for i := range conns {
		a, peer := tcpPair(b)
		go func() {
			n, _ := io.Copy(io.Discard, peer)
			readers <- n
		}()
		conns[i] = New(a, Limits{Soft: 1 << 20, Hard: 8 << 20, Policy: DropNewest}, stats, nil)
	}
	frame := make([]byte, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, c := range conns {
			c.Enqueue(frame)
		}
	}
	for _, c := range conns {
		_ = c.Close()
		<-c.Done()
	}
	b.StopTimer()
	for range subs {
		<-readers
	}
	delivered := float64(stats.Frames.Load())
	b.ReportMetric(delivered/b.Elapsed().Seconds(), "deliveries/s")
	b.ReportMetric(delivered/float64(max(1, stats.Writes.Load())), "frames/writev")
	b.ReportMetric(float64(stats.DroppedMessages.Load())/float64(b.N*subs)*100, "%dropped")
}
