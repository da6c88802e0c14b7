package connq

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"
)

// TestFlusherWritesWhatWasDueTogetherInOneWrite: frames sent through a
// Flusher wait for Flush, then leave with one writev made by the caller,
// after the frames queued before them and in their order; a held PUBACK
// released through it goes the same way.
func TestFlusherWritesWhatWasDueTogetherInOneWrite(t *testing.T) {
	a, b := tcpPair(t)
	st := new(Stats)
	c := New(a, Limits{Hard: 1 << 20}, st, nil)
	defer closeAndWait(t, c)
	r := bufioReader(b)
	var f Flusher

	h := c.HoldAck(4, 7, true)
	c.Write([]byte{0x40, 2, 0, 7}) // mochi's PUBACK 7, held
	waitFor(t, func() bool {       // the writer it started found it held and stopped
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.mu.scheduled
	})
	for i := range 3 {
		if err := f.Send(c, frameN(i)); err != nil {
			t.Fatal(err)
		}
	}
	f.Release(h)
	if got := r.peek(); got != 0 {
		t.Fatalf("%d bytes reached the peer before Flush", got)
	}
	if n := st.Writes.Load(); n != 0 {
		t.Fatalf("%d writes before Flush", n)
	}
	f.Flush()
	want := append([]byte{0x40, 2, 0, 7}, bytes.Join([][]byte{frameN(0), frameN(1), frameN(2)}, nil)...)
	if got := r.read(t, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("peer read %q, want %q", got, want)
	}
	if w, d := st.Writes.Load(), st.DirectWrites.Load(); w != 1 || d != 1 {
		t.Errorf("%d writes, %d of them direct; want 1 and 1", w, d)
	}
	if n := st.Frames.Load(); n != 4 {
		t.Errorf("%d frames counted, want 4", n)
	}
	f.Flush() // nothing due: nothing written
	if w := st.Writes.Load(); w != 1 {
		t.Errorf("%d writes after an empty Flush", w)
	}
}

// TestFlusherLeavesWhatTheSocketDoesNotTakeToTheWriter: a direct write never
// waits for a peer that does not read; the writer goroutine sends the rest,
// in order, once the peer reads again.
func TestFlusherLeavesWhatTheSocketDoesNotTakeToTheWriter(t *testing.T) {
	a, b := tcpPair(t)
	if err := a.SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if err := b.SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	st := new(Stats)
	c := New(a, Limits{Hard: 64 << 20}, st, nil)
	defer closeAndWait(t, c)
	var f Flusher
	var want []byte
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	for i := range 8 { // 256 KiB: far more than the socket buffers hold
		chunk[0] = byte('a' + i)
		frame := bytes.Clone(chunk)
		want = append(want, frame...)
		if err := f.Send(c, frame); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() { f.Flush(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Flush waited for a peer that does not read")
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the peer read the frames out of order or damaged")
	}
	if d := st.DirectWrites.Load(); d != 0 {
		t.Errorf("%d direct writes took all of 256 KiB into 4 KiB socket buffers", d)
	}
}

// TestFlushersOnOneConnection: flushers used from many goroutines at once
// on the connections they share lose no frame and keep each sender's order
// (run with -race).
func TestFlushersOnOneConnection(t *testing.T) {
	a, b := tcpPair(t)
	c := New(a, Limits{Hard: 64 << 20}, nil, nil)
	const senders, each = 4, 500
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var f Flusher
			for i := range each {
				if err := f.Send(c, []byte{byte(s), byte(i >> 8), byte(i)}); err != nil {
					t.Error(err)
					return
				}
				if i%7 == 0 {
					f.Flush()
				}
			}
			f.Flush()
		}()
	}
	wg.Wait()
	got := make([]byte, senders*each*3)
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	next := make([]int, senders)
	for i := 0; i < len(got); i += 3 {
		s, n := int(got[i]), int(got[i+1])<<8|int(got[i+2])
		if s >= senders || n != next[s] {
			t.Fatalf("frame %d: sender %d message %d, want message %d", i/3, s, n, next[s])
		}
		next[s]++
	}
	closeAndWait(t, c)
}
