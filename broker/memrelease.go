package broker

import (
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Returning memory once the broker is quiet.
//
// Go's runtime keeps freed heap pages for reuse up to its next GC goal,
// which is twice the live heap by default (GOGC=100): after a burst of
// connections (each CONNECT, SUBSCRIBE and CONNACK leaves some garbage) a
// broker holding 10,000 idle devices keeps about as much memory again as
// they need, for good, since idle devices allocate nothing that would start
// another cycle. The releaser returns those pages once the broker is quiet:
// every memReleaseEvery it looks at the runtime's counters and, when the
// heap allocated less than memQuietAlloc since the last look (no load to
// speak of) while more than memReleaseMin (and an eighth of the live heap)
// lies free, it calls debug.FreeOSMemory (a GC, then the free pages go back
// to the system), at most once per memReleaseGap. A busy broker never pays
// for it; a quiet one pays a GC now and then.
//
// The gap does not hold back the release after a burst: when the broker has
// allocated more than its live heap since the last release (a connect burst
// whose garbage is now free), the first quiet look releases, at most once per
// memReleaseBurstGap. Without that a release made just before the burst (the
// broker starting, a quiet spell) kept the burst's pages for up to 30 s; 10,000
// offline sessions then read 5.7-6.3 KiB of RSS each instead of 2.8.
const (
	memReleaseEvery    = 2 * time.Second
	memQuietAlloc      = 1 << 20
	memReleaseMin      = 8 << 20
	memReleaseGap      = 30 * time.Second
	memReleaseBurstGap = 4 * time.Second
)

// memReleaser decides from successive readings of the runtime's counters.
type memReleaser struct {
	samples      []metrics.Sample
	lastAllocs   uint64
	last         time.Time // of the last release
	allocsAtLast uint64    // the allocation counter right after the last release
	released     uint64    // times FreeOSMemory was called
}

func newMemReleaser() *memReleaser {
	return &memReleaser{samples: []metrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/heap/allocs:bytes"},
	}}
}

// decide reports whether to release now, given free and live heap bytes and
// the bytes allocated since the last decision.
func decideRelease(free, live, allocated uint64) bool {
	return allocated < memQuietAlloc && free > memReleaseMin && free > live/8
}

// releaseDue reports whether a release may come now, since after the last
// one, the broker having allocated sinceRelease bytes meanwhile and holding
// live bytes: once per memReleaseGap, or once per memReleaseBurstGap after a
// burst (more allocated than is live).
func releaseDue(since time.Duration, sinceRelease, live uint64) bool {
	return since >= memReleaseGap || (since >= memReleaseBurstGap && sinceRelease > live)
}

// check reads the counters and releases when the broker is quiet.
func (m *memReleaser) check(now time.Time) {
	metrics.Read(m.samples)
	free, live, allocs := m.samples[0].Value.Uint64(), m.samples[1].Value.Uint64(), m.samples[2].Value.Uint64()
	allocated := allocs - m.lastAllocs
	m.lastAllocs = allocs
	if releaseDue(now.Sub(m.last), allocs-m.allocsAtLast, live) && decideRelease(free, live, allocated) {
		debug.FreeOSMemory()
		m.released++
		m.last = now
		metrics.Read(m.samples[2:]) // its own allocations do not count as load
		m.lastAllocs = m.samples[2].Value.Uint64()
		m.allocsAtLast = m.lastAllocs
	}
}

// releaseMemory runs the releaser until Shutdown.
func (b *Broker) releaseMemory() {
	m := newMemReleaser()
	metrics.Read(m.samples)
	m.lastAllocs = m.samples[2].Value.Uint64()
	m.allocsAtLast = m.lastAllocs
	t := time.NewTicker(memReleaseEvery)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case now := <-t.C:
			m.check(now)
		}
	}
}
