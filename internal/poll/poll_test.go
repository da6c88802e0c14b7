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
