package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// joinGroups makes n member-less groups "$share/g<i>/<filter>": one client
// joins them all and leaves (the groups stay, with their logs).
func joinGroups(t *testing.T, addr, filter string, n int) {
	t.Helper()
	w, err := mqtttest.DialWorker(addr, "joiner", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if code, err := w.Subscribe(fmt.Sprintf("$share/g%d/%s", i, filter), 1); err != nil || code > 1 {
			t.Fatalf("subscribe to group %d: 0x%02x %v", i, code, err)
		}
	}
	w.Close()
}

// segmentBytes returns the size of the segment files of a data dir.
func segmentBytes(t *testing.T, dataDir string) int64 {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dataDir, "segments", "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range segs {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// TestManyGroupsOneStoredCopy is issue 23's items 9 and 10 against the
// binary: a publish matching 100 member-less groups is stored once for all
// of them, so a 200 KB QoS 1 publish is accepted (it was refused for
// everyone: 100 copies passed the segment size), and 50 member-less groups
// on one filter cost one copy of what is published, not 50.
func TestManyGroupsOneStoredCopy(t *testing.T) {
	t.Run("100 groups, 200 KB", func(t *testing.T) {
		p := startKeyline(t, t.TempDir())
		joinGroups(t, p.addrs["tcp"], "orders/#", 100)
		pub, err := mqtttest.DialWorker(p.addrs["tcp"], "pub", mqtttest.WorkerOptions{CleanStart: true})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		payload := bytes.Repeat([]byte("o"), 200<<10)
		for i := range 10 {
			if code, err := pub.Publish("orders/eu", payload, 1); err != nil || code != 0 {
				t.Fatalf("publish %d: PUBACK 0x%02x, %v", i, code, err)
			}
		}
	})
	t.Run("50 groups, 10 MB", func(t *testing.T) {
		dir := t.TempDir()
		p := startKeyline(t, dir) // 1 MiB segments
		joinGroups(t, p.addrs["tcp"], "win/#", 50)
		before := segmentBytes(t, dir)
		pub, err := mqtttest.DialWorker(p.addrs["tcp"], "pub", mqtttest.WorkerOptions{CleanStart: true})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		const n, size = 100, 100 << 10
		payload := []byte(strings.Repeat("w", size))
		for i := range n {
			if code, err := pub.Publish(fmt.Sprintf("win/%d", i), payload, 1); err != nil || code != 0 {
				t.Fatalf("publish %d: PUBACK 0x%02x, %v", i, code, err)
			}
		}
		grew := segmentBytes(t, dir) - before
		published := int64(n * size)
		t.Logf("%d MB published to 50 member-less groups: segments grew by %.1f MB (%.2f x; one copy per group would be 50 x)",
			published>>20, float64(grew)/(1<<20), float64(grew)/float64(published))
		// One copy, rounded up to whole 1 MiB segments, plus a spare.
		if limit := published + 3<<20; grew > limit {
			t.Fatalf("segments grew by %d bytes for %d bytes published", grew, published)
		}
	})
}
