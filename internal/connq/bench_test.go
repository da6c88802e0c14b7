package connq

import (
	"io"
	"testing"

	"github.com/keyline-mq/keyline/internal/frame"
)

// benchPublish is a 64-byte QoS 0 PUBLISH.
func benchPublish(b *testing.B) *frame.Publish {
	raw := append([]byte{0x30, 62, 0, 10}, "bench/t/01"...)
	p, err := frame.Parse(append(raw, make([]byte, 50)...), 4, 0)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

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
	frame := benchPublish(b)
	b.SetBytes(int64(len(frame.B)))
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
	if got != int64(queued*len(frame.B)) {
		b.Fatalf("peer read %d bytes, want %d", got, queued*len(frame.B))
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
	frame := benchPublish(b)
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
