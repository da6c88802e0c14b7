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
const (
	memReleaseEvery = 2 * time.Second
	memQuietAlloc   = 1 << 20
	memReleaseMin   = 8 << 20
	memReleaseGap   = 30 * time.Second
)

// memReleaser decides from successive readings of the runtime's counters.
type memReleaser struct {
	samples    []metrics.Sample
	lastAllocs uint64
	last       time.Time // of the last release
	released   uint64    // times FreeOSMemory was called
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

// check reads the counters and releases when the broker is quiet.
func (m *memReleaser) check(now time.Time) {
	metrics.Read(m.samples)
	free, live, allocs := m.samples[0].Value.Uint64(), m.samples[1].Value.Uint64(), m.samples[2].Value.Uint64()
	allocated := allocs - m.lastAllocs
	m.lastAllocs = allocs
	if now.Sub(m.last) >= memReleaseGap && decideRelease(free, live, allocated) {
		debug.FreeOSMemory()
		m.released++
		m.last = now
		metrics.Read(m.samples[2:]) // its own allocations do not count as load
		m.lastAllocs = m.samples[2].Value.Uint64()
	}
}

// releaseMemory runs the releaser until Shutdown.
func (b *Broker) releaseMemory() {
	m := newMemReleaser()
	metrics.Read(m.samples)
	m.lastAllocs = m.samples[2].Value.Uint64()
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
