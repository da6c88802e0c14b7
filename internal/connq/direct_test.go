package connq

import (
	"bytes"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
)

// A frame written to an idle TCP connection goes out at once, from the
// caller: no writer goroutine, one write.
func TestDirectWriteOnAnIdleConnection(t *testing.T) {
	a, b := tcpPair(t)
	stats := new(Stats)
	c := New(a, Limits{Hard: 1 << 20}, stats, nil)
	defer closeAndWait(t, c)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	scheduled := c.mu.scheduled
	c.mu.Unlock()
	if scheduled || stats.Writes.Load() != 1 || stats.Frames.Load() != 1 {
		t.Fatalf("scheduled %v, writes %d, frames %d: want a direct write", scheduled, stats.Writes.Load(), stats.Frames.Load())
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(b, got); err != nil || string(got) != "ping" {
		t.Fatalf("read %q %v", got, err)
	}
}

// Direct writes, queued frames and shared publishes from several goroutines
// come out whole and, per goroutine, in order, also while the socket is
// full (a small send buffer: direct writes are often partial and their
// remainders queued ahead of later frames). The seed is printed.
func TestDirectWritesKeepOrderUnderBackpressure(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	a, b := tcpPair(t)
	_ = a.SetWriteBuffer(16 << 10) // small: direct writes are often partial
	c := New(a, Limits{Hard: 64 << 20}, nil, nil)
	const writers, frames = 4, 300
	want := make([][]byte, writers)
	var wg sync.WaitGroup
	for w := range writers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range frames {
				// A frame: writer, index, length (2 bytes), then filler.
				n := 4 + rng.IntN(1500)
				f := bytes.Repeat([]byte{byte('a' + w)}, n)
				f[1], f[2], f[3] = byte(i), byte(n>>8), byte(n)
				want[w] = append(want[w], f...)
				var err error
				if rng.IntN(2) == 0 {
					_, err = c.Write(f)
				} else {
					err = c.Send(f)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	total := 0
	done := make(chan []byte)
	go func() {
		var all []byte
		buf := make([]byte, 64<<10)
		for {
			n, err := b.Read(buf)
			all = append(all, buf[:n]...)
			if err != nil {
				done <- all
				return
			}
		}
	}()
	wg.Wait()
	for _, w := range want {
		total += len(w)
	}
	closeAndWait(t, c)
	all := <-done
	if len(all) != total {
		t.Fatalf("read %d bytes, want %d", len(all), total)
	}
	// Each writer's frames, picked out in order, are what it wrote: frames
	// never interleave (each is written whole, or its rest goes first).
	got := make([][]byte, writers)
	for i := 0; i < len(all); {
		w := int(all[i] - 'a')
		if w < 0 || w >= writers || i+4 > len(all) {
			t.Fatalf("byte %d: no frame starts here", i)
		}
		n := int(all[i+2])<<8 | int(all[i+3])
		got[w] = append(got[w], all[i:i+n]...)
		i += n
	}
	for w := range writers {
		if !bytes.Equal(got[w], want[w]) {
			t.Fatalf("writer %d: its frames came out of order or mixed", w)
		}
	}
}
