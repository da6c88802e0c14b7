package keyshared

import "time"

// Clock is the dispatcher's source of time. Tests inject a fake one so that
// heartbeats, ack timeouts, backoff and eviction run without real waiting.
type Clock interface {
	Now() time.Time
	// NewTicker returns a ticker that fires every d.
	NewTicker(d time.Duration) Ticker
}

// Ticker delivers ticks on C until stopped, like time.Ticker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// SystemClock returns the Clock backed by package time.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTicker(d time.Duration) Ticker { return systemTicker{time.NewTicker(d)} }

type systemTicker struct{ t *time.Ticker }

func (t systemTicker) C() <-chan time.Time { return t.t.C }

func (t systemTicker) Stop() { t.t.Stop() }
