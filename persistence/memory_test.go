package persistence

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/poll"
	"github.com/keyline-mq/keyline/keyshared"
)

// ackAll is a Deliverer whose member acknowledges every delivery at once.
type ackAll struct{ d *keyshared.Dispatcher }

func (a *ackAll) Deliver(member string, m *keyshared.Message, _ int) bool {
	_ = a.d.Ack(member, m.Offset) // never waits for the dispatcher
	return true
}

func (a *ackAll) Revoke(string, uint64) {}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestAckedRecordsAreNotPinned is issue 23's memory case 4: messages with
// distinct keys, all acknowledged, must not stay in memory through the keys
// the dispatcher's window keeps idle (their strings were views into the
// decoded records, payload included). The heap after must stay within the
// window's byte bound of the heap before.
func TestAckedRecordsAreNotPinned(t *testing.T) {
	const n, size = 64, 1 << 20
	db := openTestDB(t, t.TempDir(), Options{NoSync: true, CacheBytes: -1})
	s := db.Groups()
	const g = "mem/#"
	log := ensure(t, s, g, GroupConfig{})
	payload := strings.Repeat("x", size)
	before := heapInUse()
	for i := range n {
		m := msg("mem/t", payload)
		m.Key = fmt.Sprintf("device-%d", i)
		mustAppend(t, s, g, m)
	}
	cfg := keyshared.DefaultConfig()
	cfg.Group = g
	out := &ackAll{}
	d, err := keyshared.New(cfg, log, out)
	if err != nil {
		t.Fatal(err)
	}
	out.d = d
	defer d.Close(context.Background())
	if err := d.AddMember("m", keyshared.MemberOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Notify()
	// Each wait covers one 1 MiB message read, delivered and acknowledged:
	// one deadline for all 64 measured the CPU the test got (under -race on
	// the loaded machine the process got about a tenth of a core, and the
	// whole run took past 30 s in 4 of 6 runs).
	poll.Progress(t, 30*time.Second, "acks", func() uint64 { return d.Stats().Acked }, n)
	if err := d.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := heapInUse()
	st := d.Stats()
	bound := uint64(cfg.WindowBytes) + 4<<20 // the window, and slack for the runtime and the store
	t.Logf("%d messages of %d bytes, distinct keys, all acked: heap %.1f MB before, %.1f MB after (bound %.1f MB over before); window holds %d bytes",
		n, size, float64(before)/1e6, float64(after)/1e6, float64(bound)/1e6, st.WindowBytes)
	if after > before+bound {
		t.Fatalf("heap grew by %.1f MB with everything acked, bound %.1f MB", float64(after-before)/1e6, float64(bound)/1e6)
	}
	runtime.KeepAlive(d)
}
