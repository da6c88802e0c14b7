package broker

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
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
// Neither the gap nor memReleaseMin holds back the release after a burst:
// when the broker has allocated more than its live heap since the last
// release (a connect burst, whose garbage is free or awaits the GC that
// FreeOSMemory starts), the first quiet look releases, at most once per
// memReleaseBurstGap. Without that a release made just before the burst (the
// broker starting, a quiet spell) kept the burst's pages for up to 30 s;
// 10,000 offline sessions then read 5.7-6.3 KiB of RSS each instead of 2.8;
// and after 10,000 sessions only 6.8 MB lay free (under memReleaseMin) beside
// some 6 MB of garbage no GC had collected yet. Such a release costs at most
// one GC per live heap allocated, as the GC's own pacing does.
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

// decide reports whether to release now, given free and live heap bytes,
// the bytes allocated since the last decision and whether a burst came
// since the last release.
func decideRelease(free, live, allocated uint64, burst bool) bool {
	return allocated < memQuietAlloc && (burst || (free > memReleaseMin && free > live/8))
}

// releaseDue reports whether a release may come now, since after the last
// one, the broker having allocated sinceRelease bytes meanwhile and holding
// live bytes: once per memReleaseGap, or once per memReleaseBurstGap after a
// burst (more allocated than is live; burst reports that).
func releaseDue(since time.Duration, sinceRelease, live uint64) (due, burst bool) {
	burst = since >= memReleaseBurstGap && sinceRelease > live
	return since >= memReleaseGap || burst, burst
}

// check reads the counters and releases when the broker is quiet.
func (m *memReleaser) check(now time.Time) {
	metrics.Read(m.samples)
	free, live, allocs := m.samples[0].Value.Uint64(), m.samples[1].Value.Uint64(), m.samples[2].Value.Uint64()
	allocated := allocs - m.lastAllocs
	m.lastAllocs = allocs
	if due, burst := releaseDue(now.Sub(m.last), allocs-m.allocsAtLast, live); due && decideRelease(free, live, allocated, burst) {
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
	defer gcBurst.stop()
	for {
		select {
		case <-b.stop:
			return
		case now := <-t.C:
			gcBurst.tick()
			m.check(now)
		}
	}
}

// Collecting more often during a connect burst.
//
// Freed heap slots are reused only by later allocations of their size, so the
// garbage of a connect burst's last GC cycles stays as holes in spans that
// the connections' long-lived state keeps in use, for as long as the devices
// stay idle (they allocate nothing). At keyline's GOGC of 200 (main.go) a cycle
// lets up to twice the live heap of garbage pile up: 10,000 idle connections
// held 3.6 KiB of heap each for 2.4 KiB of live objects (heap profile at
// memprofilerate=1). While connections arrive fast on a broker that knows
// many clients (the fleet case; not a benchmark's or a test's thousand), the
// GC runs at GOGC gcBurstPercent, so each cycle leaves a quarter of the holes;
// the first releaser tick with no new connection restores the process's
// GOGC. At GOGC 50 the same 10,000 connections held 2.9 KiB of heap and 3.7
// KiB of RSS each instead of 3.6 and 4.0-4.8 KiB, for about the same CPU per
// connection (161 against 155-167 µs; at 25, 202 µs).
const (
	gcBurstAccepts = 256         // accepts per look at the rate
	gcBurstWindow  = time.Second // ... arriving within this start a burst
	gcBurstClients = 4096        // and only with at least this many clients known
	gcBurstPercent = 50
)

// gcBurst is the process's: the GC percent is the process's, and a test
// process runs many brokers.
var gcBurst burstGC

type burstGC struct {
	accepts     atomic.Uint64
	windowStart atomic.Int64 // unix nanoseconds of the accept that began the current gcBurstAccepts
	mu          sync.Mutex
	on          bool
	normal      int    // the GC percent outside bursts, read when the first burst starts
	seen        uint64 // accepts at the last tick
	bursts      uint64 // bursts started (tests)
}

// accepted counts a connection accepted; clients returns how many clients
// the server knows (connected or offline).
func (g *burstGC) accepted(now time.Time, clients func() int) {
	n := g.accepts.Add(1)
	if n%gcBurstAccepts != 0 {
		return
	}
	start := g.windowStart.Swap(now.UnixNano())
	if start == 0 || now.UnixNano()-start > int64(gcBurstWindow) || clients() < gcBurstClients {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on {
		return
	}
	normal := debug.SetGCPercent(gcBurstPercent) // there is no getter
	if normal < 0 || normal <= gcBurstPercent {  // GC off, or as low already: leave it
		debug.SetGCPercent(normal)
		return
	}
	g.normal, g.on = normal, true
	g.bursts++
}

// stop ends a burst now (the broker stopping).
func (g *burstGC) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on {
		debug.SetGCPercent(g.normal)
		g.on = false
	}
}

// tick ends a burst once no connection came since the last tick.
func (g *burstGC) tick() {
	n := g.accepts.Load()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on && n == g.seen {
		debug.SetGCPercent(g.normal)
		g.on = false
	}
	g.seen = n
}
