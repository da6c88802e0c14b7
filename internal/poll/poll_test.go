package poll

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3 {
			n.Add(1)
		}
	}()
	<-done
	if !Within(time.Second, func() bool { return n.Load() == 3 }) {
		t.Fatal("a condition that holds was not seen")
	}
	asked := 0
	if Within(3*Interval, func() bool { asked++; return false }) || asked < 2 {
		t.Fatalf("a condition that never holds: asked %d times", asked)
	}
}

func TestProgress(t *testing.T) {
	// A count that moves at every look reaches its target however long the
	// run is.
	var n uint64
	Progress(t, 3*Interval, "steps", func() uint64 { n++; return n }, 1000)
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		Progress(ft, 3*Interval, "steps", func() uint64 { return 7 }, 8)
	}()
	if !ft.failed {
		t.Fatal("a count that never moves did not fail")
	}
}

// fakeT records Fatalf and stops the calling function, as t.Fatalf does.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(string, ...any) {
	f.failed = true
	panic("fatal")
}
