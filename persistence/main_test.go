package persistence

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// When bbolt's Open meets a garbled page it panics (Open turns that into
		// ErrCorrupt) and leaves behind the goroutine that was to collect the
		// freelist scan's errors. TestOpenBadFiles/garbled_pages does that on purpose.
		goleak.IgnoreTopFunction("go.etcd.io/bbolt.(*DB).freepages.func2"),
	)
}
